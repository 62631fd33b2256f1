"""The dropless mixture of experts under a mesh: each device sorts its own tokens, and experts
split over mesh axes (expert parallelism) see the tokens of their group.

Left to the compiler, the dropless path's sort of every token by expert is a sort of the
global batch: each device would gather all tokens to sort them. Here the layer runs per shard
(`jax.shard_map` over the whole mesh, as models/flash_attention.py places its kernel):

- tokens: each device holds its rows (the logical `batch` axis's mesh axes);
- experts: the stacked weights are split over the logical `experts` axis's mesh axes (the
  `expert` mesh axis by default), each device holding E / ways of them, and over `mlp`'s (the
  `tensor` axis: each expert's hidden width in slices); their `embed` axis, split as FSDP
  splits it, is gathered whole inside (an all-gather, whose gradient is a reduce-scatter);
- where the rows are split over an expert axis too (the default: the batch is split over
  every data-parallel axis, the expert axis included), the devices of one expert group first
  gather their rows (all-gather over that axis), so each device has the group's tokens; it
  runs the assignments to its own experts (the others sort past the groups and give zeros),
  and the partial outputs are summed back to their rows' devices (a reduce-scatter). Rows
  not split over an expert axis are already the group's on every device: the outputs are
  summed there (a psum). A sliced hidden width is summed over its axis first.

This is the all-gather / reduce-scatter form of expert parallelism: its traffic is the group's
activations, not only the routed ones (an all-to-all moves k / E of them), traded for sizes
that never depend on the routing. Without a mesh of more than one device it is
`expert_dispatch.dropless` on all tokens.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from lingvo_lite.models import expert_dispatch


def _axes(logical: str, size: int, mesh: jax.sharding.AbstractMesh) -> tuple[str, ...]:
  """The mesh axes (of more than one device) a dimension of `size` along the logical axis is
  split over, or () where they do not divide it (one row, as shapes are traced with)."""
  mapped = nn.logical_to_mesh_axes((logical,))[0]
  names = (mapped,) if isinstance(mapped, str) else tuple(mapped or ())
  names = tuple(name for name in names if mesh.shape[name] > 1)
  ways = 1
  for name in names:
    ways *= mesh.shape[name]
  return names if size % ways == 0 else ()


def _spec(*dims: tuple[str, ...]) -> PartitionSpec:
  return PartitionSpec(*(dim if dim else None for dim in dims))


def dropless(x: jax.Array, routing: expert_dispatch.Routing,
             weights: expert_dispatch.ExpertWeights,
             activation: expert_dispatch.ExpertActivation, alpha: float, limit: float
             ) -> jax.Array:
  """`expert_dispatch.dropless` of x [B, L, D] (routing over its B x L tokens), per shard:
  [B, L, D]."""
  batch, length, dim = x.shape
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return expert_dispatch.dropless(x.reshape(-1, dim), routing, weights, activation, alpha, limit)
  num_experts, _, hidden = weights.wi.shape
  k = routing.experts.shape[-1]
  rows = _axes("batch", batch, mesh)
  experts = _axes("experts", num_experts, mesh)
  sliced = _axes("mlp", hidden, mesh)
  # The weights' model width as the parameters lie (FSDP), gathered inside: the gradient of
  # an all-gather is a reduce-scatter, where a width gathered at the boundary would make the
  # backward pass all-reduce whole expert weights.
  width = tuple(axis for axis in _axes("embed", dim, mesh) if axis not in experts + sliced)
  gathered = tuple(axis for axis in experts if axis in rows)
  ways = 1
  for axis in experts:
    ways *= mesh.shape[axis]
  local_experts = num_experts // ways

  def per_shard(x, chosen, routing_weights, wi, wi_gate, wo, wi_bias, wi_gate_bias, wo_bias):
    if width:
      wi, wi_gate = (jax.lax.all_gather(w, width, axis=1, tiled=True) for w in (wi, wi_gate))
      wo = jax.lax.all_gather(wo, width, axis=2, tiled=True)
      if wo_bias is not None:
        wo_bias = jax.lax.all_gather(wo_bias, width, axis=1, tiled=True)
    if gathered:
      x, chosen, routing_weights = (jax.lax.all_gather(a, gathered, axis=0, tiled=True)
                                    for a in (x, chosen, routing_weights))
    tokens = x.reshape(-1, dim)
    chosen, routing_weights = chosen.reshape(-1, k), routing_weights.reshape(-1, k)
    first = jax.lax.axis_index(experts) * local_experts if experts else 0
    local = chosen - first
    here = (local >= 0) & (local < local_experts)
    order, group_sizes, experts_of_rows = expert_dispatch.sorted_by_expert(
        jnp.where(here, local, local_experts), local_experts)
    shard_weights = expert_dispatch.ExpertWeights(wi, wi_gate, wo, wi_bias, wi_gate_bias, None)
    out = expert_dispatch.run_grouped(jnp.take(tokens, order // k, axis=0), group_sizes,
                                      experts_of_rows, shard_weights, activation, alpha, limit)
    out = expert_dispatch.unsort(out, order).reshape(-1, k, dim)
    y = jnp.einsum("tkd,tk->td", out, routing_weights)
    if sliced:
      y = jax.lax.psum(y, sliced)
    if wo_bias is not None:  # Each token's share of its experts' biases held here.
      y = y + expert_dispatch.output_bias(shard_weights._replace(wo_bias=wo_bias),
                                          jnp.where(here, local, 0),
                                          jnp.where(here, routing_weights, 0), jnp.float32)
    if gathered:
      y = jax.lax.psum_scatter(y, gathered, scatter_dimension=0, tiled=True)
      others = tuple(axis for axis in experts if axis not in gathered)
      if others:
        y = jax.lax.psum(y, others)
    elif experts:
      y = jax.lax.psum(y, experts)
    return y.astype(x.dtype).reshape(-1, length, dim)

  chosen = routing.experts.reshape(batch, length, k)
  routing_weights = routing.weights.reshape(batch, length, k)
  token_spec = _spec(rows, (), ())
  bias_specs = (_spec(experts, sliced), _spec(experts, sliced), _spec(experts, width))
  run = jax.shard_map(
      per_shard, in_specs=(token_spec, token_spec, token_spec, _spec(experts, width, sliced),
                           _spec(experts, width, sliced), _spec(experts, sliced, width),
                           *(None if b is None else spec for b, spec in zip(
                               (weights.wi_bias, weights.wi_gate_bias, weights.wo_bias),
                               bias_specs))),
      out_specs=token_spec, check_vma=False)
  return run(x, chosen, routing_weights, weights.wi, weights.wi_gate, weights.wo,
             weights.wi_bias, weights.wi_gate_bias, weights.wo_bias)
