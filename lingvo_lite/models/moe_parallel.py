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

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from lingvo_lite.models import expert_dispatch, mesh_axes


class _Shards(NamedTuple):
  """How `dropless`'s operands lie on the mesh: the mesh axes (of more than one device) each
  dimension is split over."""
  rows: tuple[str, ...]  # The tokens' rows (the batch).
  experts: tuple[str, ...]  # The stacked experts.
  sliced: tuple[str, ...]  # Each expert's hidden width.
  # The weights' model width as the parameters lie (FSDP), gathered inside: the gradient of
  # an all-gather is a reduce-scatter, where a width gathered at the boundary would make the
  # backward pass all-reduce whole expert weights.
  width: tuple[str, ...]
  gathered: tuple[str, ...]  # The expert axes the rows are split over too: an expert group.
  local_experts: int  # The experts each device holds.


def _shards(x: jax.Array, weights: expert_dispatch.ExpertWeights,
            mesh: jax.sharding.AbstractMesh) -> _Shards:
  """Where x [B, L, D] and the experts' `weights` are split on `mesh`."""
  batch, _, dim = x.shape
  num_experts, _, hidden = weights.wi.shape
  rows = mesh_axes.split_over("batch", batch, mesh)
  experts = mesh_axes.split_over("experts", num_experts, mesh)
  sliced = mesh_axes.split_over("mlp", hidden, mesh)
  width = tuple(axis for axis in mesh_axes.split_over("embed", dim, mesh)
                if axis not in experts + sliced)
  return _Shards(rows, experts, sliced, width, tuple(axis for axis in experts if axis in rows),
                 num_experts // mesh_axes.ways(experts, mesh))


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
  k = routing.experts.shape[-1]
  shards = _shards(x, weights, mesh)
  chosen = routing.experts.reshape(batch, length, k)
  routing_weights = routing.weights.reshape(batch, length, k)
  run = jax.shard_map(
      functools.partial(_per_shard, shards, activation, alpha, limit),
      in_specs=_in_specs(shards, weights), out_specs=mesh_axes.spec(shards.rows, (), ()),
      check_vma=False)
  return run(x, chosen, routing_weights, weights.wi, weights.wi_gate, weights.wo,
             weights.wi_bias, weights.wi_gate_bias, weights.wo_bias)


def _in_specs(shards: _Shards, weights: expert_dispatch.ExpertWeights
              ) -> tuple[PartitionSpec | None, ...]:
  """The specs of a per-shard dispatch's operands: the tokens [B, L, D], the chosen experts
  and their weights [B, L, k], the stacked weights, their biases (None where there are
  none)."""
  spec, experts, sliced, width = mesh_axes.spec, shards.experts, shards.sliced, shards.width
  token_spec = spec(shards.rows, (), ())
  bias_specs = (spec(experts, sliced), spec(experts, sliced), spec(experts, width))
  return (token_spec, token_spec, token_spec, spec(experts, width, sliced),
          spec(experts, width, sliced), spec(experts, sliced, width),
          *(None if b is None else bias_spec for b, bias_spec in zip(
              (weights.wi_bias, weights.wi_gate_bias, weights.wo_bias), bias_specs)))


def _per_shard(shards: _Shards, activation: expert_dispatch.ExpertActivation, alpha: float,
               limit: float, x: jax.Array, chosen: jax.Array, routing_weights: jax.Array,
               wi: jax.Array, wi_gate: jax.Array, wo: jax.Array, wi_bias: jax.Array | None,
               wi_gate_bias: jax.Array | None, wo_bias: jax.Array | None) -> jax.Array:
  """One device's part of `dropless`: its expert group's tokens through the experts it holds,
  the partial outputs summed back onto its own rows [rows here, L, D]."""
  length, dim, k = x.shape[1], x.shape[2], chosen.shape[-1]
  wi, wi_gate, wo, wo_bias = _whole_width(shards, wi, wi_gate, wo, wo_bias)
  if shards.gathered:
    x, chosen, routing_weights = (jax.lax.all_gather(a, shards.gathered, axis=0, tiled=True)
                                  for a in (x, chosen, routing_weights))
  tokens = x.reshape(-1, dim)
  chosen, routing_weights = chosen.reshape(-1, k), routing_weights.reshape(-1, k)
  first = jax.lax.axis_index(shards.experts) * shards.local_experts if shards.experts else 0
  local = chosen - first
  here = (local >= 0) & (local < shards.local_experts)
  order, group_sizes, experts_of_rows = expert_dispatch.sorted_by_expert(
      jnp.where(here, local, shards.local_experts), shards.local_experts)
  shard_weights = expert_dispatch.ExpertWeights(wi, wi_gate, wo, wi_bias, wi_gate_bias, None)
  out = expert_dispatch.run_grouped(jnp.take(tokens, order // k, axis=0), group_sizes,
                                    experts_of_rows, shard_weights, activation, alpha, limit)
  y = expert_dispatch.weighted_sum(expert_dispatch.unsort(out, order).reshape(-1, k, dim),
                                   routing_weights)
  if shards.sliced:
    y = jax.lax.psum(y, shards.sliced)
  if wo_bias is not None:  # Each token's share of its experts' biases held here.
    y = y + expert_dispatch.output_bias(shard_weights._replace(wo_bias=wo_bias),
                                        jnp.where(here, local, 0),
                                        jnp.where(here, routing_weights, 0), jnp.float32)
  return _summed_back(shards, y).astype(x.dtype).reshape(-1, length, dim)


def _whole_width(shards: _Shards, wi: jax.Array, wi_gate: jax.Array, wo: jax.Array,
                 wo_bias: jax.Array | None) -> tuple[jax.Array, ...]:
  """The experts' weights held here with their model width gathered whole (`_Shards.width`)."""
  if not shards.width:
    return wi, wi_gate, wo, wo_bias
  wi, wi_gate = (jax.lax.all_gather(w, shards.width, axis=1, tiled=True) for w in (wi, wi_gate))
  wo = jax.lax.all_gather(wo, shards.width, axis=2, tiled=True)
  if wo_bias is not None:
    wo_bias = jax.lax.all_gather(wo_bias, shards.width, axis=1, tiled=True)
  return wi, wi_gate, wo, wo_bias


def _summed_back(shards: _Shards, y: jax.Array) -> jax.Array:
  """The partial outputs of an expert group's tokens [tokens, D] summed over the devices of
  the group and scattered back to their rows' devices (or summed where rows are not split)."""
  if shards.gathered:
    y = jax.lax.psum_scatter(y, shards.gathered, scatter_dimension=0, tiled=True)
    others = tuple(axis for axis in shards.experts if axis not in shards.gathered)
    if others:
      y = jax.lax.psum(y, others)
  elif shards.experts:
    y = jax.lax.psum(y, shards.experts)
  return y


def slots(assignments: int, ways: int, factor: float) -> int:
  """The rows a device sends each of `ways` expert shards under "all_to_all": `factor` times
  its fair share of the `assignments` (T x k), at most all of them (nothing is dropped)."""
  return max(1, min(assignments, math.ceil(factor * assignments / ways)))


def all_to_all(x: jax.Array, routing: expert_dispatch.Routing,
               weights: expert_dispatch.ExpertWeights, factor: float,
               activation: expert_dispatch.ExpertActivation, alpha: float, limit: float
               ) -> tuple[jax.Array, jax.Array]:
  """The experts on x [B, L, D] with the routed rows moved to their experts' devices
  (GShard's and MaxText's all-to-all): ([B, L, D], the fraction of assignments dropped).

  Each device sends each expert shard at most `slots(T x k, ways, factor)` of its T tokens' k
  assignments (first come first served in token order; the rest are dropped, as "capacity"
  drops them), one `jax.lax.all_to_all` there and one back, so the rows a device holds are
  `factor` x T x k rather than the gathered form's ways x T x k. With `factor` at least the
  expert ways nothing is dropped and it is `dropless`. Where the rows are not split over every
  expert axis (nothing to exchange), or without a mesh, it is `dropless`."""
  batch, length, dim = x.shape
  mesh = jax.sharding.get_abstract_mesh()
  nothing = jnp.zeros((), jnp.float32)
  if mesh.empty or mesh.size == 1:
    return dropless(x, routing, weights, activation, alpha, limit), nothing
  shards = _shards(x, weights, mesh)
  if not shards.experts or shards.gathered != shards.experts:
    return dropless(x, routing, weights, activation, alpha, limit), nothing
  k = routing.experts.shape[-1]
  run = jax.shard_map(
      functools.partial(_exchanged, shards, mesh_axes.ways(shards.experts, mesh), activation,
                        alpha, limit, factor),
      in_specs=_in_specs(shards, weights),
      out_specs=(mesh_axes.spec(shards.rows, (), ()), PartitionSpec()), check_vma=False)
  return run(x, routing.experts.reshape(batch, length, k),
             routing.weights.reshape(batch, length, k), weights.wi, weights.wi_gate,
             weights.wo, weights.wi_bias, weights.wi_gate_bias, weights.wo_bias)


def _exchanged(shards: _Shards, ways: int, activation: expert_dispatch.ExpertActivation,
               alpha: float, limit: float, factor: float, x: jax.Array, chosen: jax.Array,
               routing_weights: jax.Array, wi: jax.Array, wi_gate: jax.Array, wo: jax.Array,
               wi_bias: jax.Array | None, wi_gate_bias: jax.Array | None,
               wo_bias: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """One device's part of `all_to_all` (`ways`: the expert shards): its rows to their
  experts' devices, the experts it holds on the rows it receives, the outputs back, weighed
  and summed per token."""
  length, dim, k = x.shape[1], x.shape[2], chosen.shape[-1]
  wi, wi_gate, wo, wo_bias = _whole_width(shards, wi, wi_gate, wo, wo_bias)
  tokens, flat = x.reshape(-1, dim), chosen.reshape(-1)
  local, count = shards.local_experts, slots(flat.shape[0], ways, factor)
  # Each assignment's place in its destination's slots: its rank among the assignments to
  # that destination, in token order; past `count` it is dropped (slot ways x count: none).
  destination = flat // local
  order = jnp.argsort(destination, stable=True)
  sizes = jnp.bincount(destination, length=ways)
  rank = jnp.arange(flat.shape[0]) - (jnp.cumsum(sizes) - sizes)[destination[order]]
  rank = expert_dispatch.unsort(rank, order)
  kept = rank < count
  slot = jnp.where(kept, destination * count + rank, ways * count)
  # Which assignment fills each slot (none: a zero row, and expert `local`: in no group).
  source = jnp.full((ways * count + 1,), flat.shape[0]).at[slot].set(
      jnp.arange(flat.shape[0]))[:-1]
  filled = source < flat.shape[0]
  send = jnp.take(tokens, jnp.where(filled, source // k, 0), axis=0)
  send = jnp.where(filled[:, None], send, jnp.zeros((), send.dtype))
  send_expert = jnp.where(filled, jnp.take(flat, jnp.minimum(source, flat.shape[0] - 1))
                          - (jnp.arange(ways * count) // count) * local, local)
  exchange = functools.partial(jax.lax.all_to_all, axis_name=shards.experts, split_axis=0,
                               concat_axis=0, tiled=True)
  received, received_expert = exchange(send), exchange(send_expert)
  order, group_sizes, experts_of_rows = expert_dispatch.sorted_by_expert(
      received_expert[:, None], local)
  shard_weights = expert_dispatch.ExpertWeights(wi, wi_gate, wo, wi_bias, wi_gate_bias, None)
  out = expert_dispatch.run_grouped(jnp.take(received, order, axis=0), group_sizes,
                                    experts_of_rows, shard_weights, activation, alpha, limit)
  back = exchange(expert_dispatch.unsort(out, order))
  back = jnp.concatenate([back, jnp.zeros((1, dim), back.dtype)])
  y = expert_dispatch.weighted_sum(jnp.take(back, slot, axis=0).reshape(-1, k, dim),
                                   routing_weights.reshape(-1, k))
  if shards.sliced:
    y = jax.lax.psum(y, shards.sliced)
  if wo_bias is not None:  # Each token's share of its kept experts' biases, all of them here.
    everyone = jax.lax.all_gather(wo_bias, shards.experts, axis=0, tiled=True)
    y = y + expert_dispatch.output_bias(shard_weights._replace(wo_bias=everyone), chosen.reshape(
        -1, k), jnp.where(kept.reshape(-1, k), routing_weights.reshape(-1, k), 0), jnp.float32)
  dropped = jax.lax.pmean(1.0 - jnp.mean(kept.astype(jnp.float32)), shards.rows)
  return y.astype(x.dtype).reshape(-1, length, dim), dropped
