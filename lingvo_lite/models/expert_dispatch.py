"""Routing tokens to experts and running them: the arithmetic of a mixture-of-experts layer
(models/moe.py), whose three dispatches compute the same function where nothing is dropped.

Routing (`route`), in float32 whatever the compute dtype (int8 never reaches the router):
router logits x @ W_r (+ b_r), scores softmax(logits) over the E experts (or sigmoid, as
DeepSeek's), the k highest, and their weights: the scores of the chosen k, divided by their
sum when `renormalize` (Mixtral always; Qwen3-MoE per its `norm_topk_prob`). gpt-oss's
softmax over the chosen k logits is exactly softmax-then-renormalize: exp(l_i) / sum over
the chosen k of exp(l_j) is p_i / sum of p_j. DeepSeek's choices on top (transformers'
DeepseekV3TopkRouter and DeepseekV2TopkRouter): a per-expert selection bias added to the
scores for choosing only (V3's auxiliary-loss-free balance, models/expert_balance.py moves
it), the choice limited to a token's best groups of experts (`ExpertGroups`), and the
weights times a routed scaling factor.

Dispatch (the layer's `dispatch`):

- "dropless": the T x k (token, expert) assignments sorted by expert, each token's features
  gathered into that order, and every expert's rows multiplied by its weights in one grouped
  matmul (`jax.lax.ragged_dot`: MaxText's "megablox" path); the outputs are put back in token
  order and summed with the routing weights. No token is dropped, whatever the balance.
- "capacity": GShard and Switch's fixed-size dispatch. Each batch row is a group; each expert
  takes at most C = ceil(capacity_factor x length x k / E) of the row's assignments (at most
  the row's length), first choices before second ones and earlier tokens before later ones;
  an assignment past C is dropped (its token keeps the other experts' outputs and the
  residual: Switch's "passes through"). Dispatch and combine are one-hot einsums, whose
  shapes never depend on the routing; the fraction dropped is the `dropped` statistic.
- "dense": every expert on every token, masked by the routing weights: the reference the two
  others are tested against (E / k times the FLOPs), and a baseline for the benchmark.

Expert activations: "swiglu" (silu(x W_gate) * x W_up) or gpt-oss's "clamped_swiglu": gate
clamped above at `swiglu_limit`, up clamped to [-limit, limit], out (up + 1) * gate *
sigmoid(alpha * gate). Parameters: `router_kernel` [embed, experts] (and `router_bias`),
`wi` (the activated projection, Hugging Face's gate_proj / w1), `wi_gate` (the multiplied one,
up_proj / w3), `wo` (down_proj / w2), stacked [experts, ...], with biases of the same names
plus `_bias` under `expert_bias`.

The three dispatches and the routing they share stay beside each other, in one module, to
stay equal (tests/models/test_moe.py compares them); run per shard under a mesh by
models/moe_parallel.py.
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp

from lingvo_lite.models import grouped_matmul, layers
from lingvo_lite.models import quantization as quantizing
from lingvo_lite.models.quantization import Quantization
from lingvo_lite.models.remat import tag
from lingvo_lite.target import current_platform

RouterScore = Literal["softmax", "sigmoid"]
ExpertActivation = Literal["swiglu", "clamped_swiglu"]
GroupScore = Literal["max", "top2_sum"]


class Routing(NamedTuple):
  """Where each of T tokens goes.

  Attributes:
    logits: float32 [T, E], the router's.
    scores: float32 [T, E], softmax (or sigmoid) of the logits.
    weights: float32 [T, k], each chosen expert's weight in the token's output.
    experts: int32 [T, k], the chosen experts, highest (biased) score first.
  """

  logits: jax.Array
  scores: jax.Array
  weights: jax.Array
  experts: jax.Array


class ExpertGroups(NamedTuple):
  """Group-limited routing (DeepSeek's): the E experts in `count` groups of E / count, each
  token choosing among the experts of its `chosen` best groups only.

  Attributes:
    count: The groups (n_group); 1: no limit.
    chosen: The groups a token's experts come from (topk_group).
    score: How a group scores for a token: "max", its best expert's score (DeepSeek-V2's
      group_limited_greedy), or "top2_sum", its two best (DeepSeek-V3's, of the biased
      scores; a group of one expert scores its one).
  """

  count: int = 1
  chosen: int = 1
  score: GroupScore = "max"


def _within_groups(choice: jax.Array, groups: ExpertGroups) -> jax.Array:
  """`choice` [T, E] with -inf outside each token's `groups.chosen` best groups."""
  tokens, experts = choice.shape
  if groups.count == 1 or groups.chosen >= groups.count:
    return choice
  size = experts // groups.count
  grouped = choice.reshape(tokens, groups.count, size)
  if groups.score == "max":
    group_scores = jnp.max(grouped, axis=-1)
  else:
    group_scores = jnp.sum(jax.lax.top_k(grouped, min(2, size))[0], axis=-1)
  best = jax.lax.top_k(group_scores, groups.chosen)[1]
  kept = jnp.any(jax.nn.one_hot(best, groups.count, dtype=jnp.bool_), axis=-2)  # [T, groups]
  return jnp.where(jnp.repeat(kept, size, axis=-1), choice, -jnp.inf)


def route(logits: jax.Array, k: int, score: RouterScore = "softmax",
          renormalize: bool = True, groups: ExpertGroups = ExpertGroups(),
          selection_bias: jax.Array | None = None, scaling: float = 1.0) -> Routing:
  """The k experts of each token (rows of float32 `logits` [T, E]): the highest scores, or
  with `selection_bias` [E] the highest scores plus the bias (DeepSeek-V3's auxiliary-loss-
  free balance: the bias chooses, it never weighs, and no gradient reaches it), among the
  experts of the token's best `groups`. Each chosen expert weighs its score (renormalized
  over the k where asked), times `scaling` (routed_scaling_factor)."""
  logits = logits.astype(jnp.float32)
  scores = jax.nn.softmax(logits, axis=-1) if score == "softmax" else jax.nn.sigmoid(logits)
  choice = scores
  if selection_bias is not None:
    choice = scores + jax.lax.stop_gradient(selection_bias.astype(jnp.float32))
  experts = jax.lax.top_k(_within_groups(choice, groups), k)[1]
  weights = jnp.take_along_axis(scores, experts, axis=-1)
  if renormalize:  # DeepSeek-V3's 1e-20 keeps sigmoid scores that all round to 0 finite.
    weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
  if scaling != 1.0:
    weights = weights * scaling
  return Routing(logits, scores, weights, experts.astype(jnp.int32))


def expert_counts(experts: jax.Array, num_experts: int) -> jax.Array:
  """float32 [E]: how many of the assignments `experts` [T, k] each expert has."""
  return jnp.sum(jax.nn.one_hot(experts.reshape(-1), num_experts, dtype=jnp.float32), axis=0)


def mean_probabilities(routing: Routing, score: RouterScore = "softmax") -> jax.Array:
  """[E]: each expert's mean score over the tokens, the balance loss's second factor.
  Sigmoid scores are normalized per token first (as DeepSeek's balance loss does)."""
  probabilities = routing.scores
  if score == "sigmoid":
    probabilities = probabilities / jnp.sum(probabilities, axis=-1, keepdims=True)
  return jnp.mean(probabilities, axis=0)


def load_balance_loss(routing: Routing, score: RouterScore = "softmax") -> jax.Array:
  """E x sum_e (tokens that chose e / T) x mean score of e (the module doc): k at balance."""
  tokens, num_experts = routing.scores.shape
  fraction = expert_counts(routing.experts, num_experts) / tokens
  return num_experts * jnp.sum(fraction * mean_probabilities(routing, score))


def router_z_loss(logits: jax.Array) -> jax.Array:
  """The mean over tokens of logsumexp(router logits)^2 (ST-MoE)."""
  return jnp.mean(jnp.square(jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)))


def capacity(length: int, k: int, num_experts: int, factor: float) -> int:
  """Assignments an expert takes from a row of `length` tokens: ceil(factor x length x k / E),
  at least 1 and at most `length` (a token chooses an expert once)."""
  return max(1, min(length, math.ceil(factor * length * k / num_experts)))


def dense_weight(weight: Any, dtype: jnp.dtype, quantization: Quantization | None = None
                 ) -> jax.Array:
  """A stacked expert weight [experts, in, out] as its matmul takes it: int8 values times
  their scales (under "int8_weights": read from memory as int8, multiplied in the compute
  dtype; float weights under that setting are quantized first, the same numbers), or cast."""
  if quantization == "int8_weights" and not quantizing.is_quantized(weight):
    weight = quantizing.quantize(weight, contracted=(1,))
  if quantizing.is_quantized(weight):
    return weight.qvalue.astype(dtype) * weight.scale.astype(dtype)
  return weight.astype(dtype)


class ExpertWeights(NamedTuple):
  """The stacked experts' weights (biases None without `expert_bias`), in the compute dtype."""

  wi: jax.Array
  wi_gate: jax.Array
  wo: jax.Array
  wi_bias: jax.Array | None
  wi_gate_bias: jax.Array | None
  wo_bias: jax.Array | None


def activate(gate: jax.Array, up: jax.Array, activation: ExpertActivation, alpha: float,
             limit: float) -> jax.Array:
  """The experts' gated activation of the activated (`gate`) and multiplied (`up`)
  projections."""
  if activation == "swiglu":
    return jax.nn.silu(gate) * up
  gate = jnp.minimum(gate, limit)
  up = jnp.clip(up, -limit, limit)
  return (up + 1) * (gate * jax.nn.sigmoid(gate * alpha))


# Rows of a tile of the grouped matmul on CPUs (`_tiled_grouped`): padding per expert is under
# a tile, and the weights are gathered once per tile.
CPU_TILE_ROWS = 64


def run_grouped(x: jax.Array, group_sizes: jax.Array, experts_of_rows: jax.Array,
                weights: ExpertWeights, activation: ExpertActivation, alpha: float,
                limit: float) -> jax.Array:
  """The experts on rows sorted by expert, before the output projection's bias: x [N, D],
  the first group_sizes[0] rows expert 0's, and so on (rows past the groups give zeros);
  `experts_of_rows` [N] each row's expert, for the input biases (any valid index past the
  groups). Returns [N, D] in x's dtype: each assignment's row, which the caller weighs and sums
  in float32 (`weighted_sum`). In the compute dtype, as a dense MLP's output projection is:
  these rows are k per token, and for DeepSeek-V3 on a v5e in float32 they were nine buffers
  of 7 GiB a layer (bench/results/2026-12-07/deepseek/compile_verdicts.md).

  The grouped matmuls are `jax.lax.ragged_dot` where the compiler has a grouped kernel
  (`grouped_matmul.ragged_dot`: under a pipeline's `vmap` over its stages, products without a
  batch dimension, which XLA:TPU needs); on CPUs, whose XLA rewrites it into one dense matmul
  per expert (E times the work: measured 10x slower than the capacity path at 32 experts),
  tiles of rows of one expert each (`_tiled_grouped`)."""
  if current_platform() == "cpu":
    return _tiled_grouped(x, group_sizes, weights, activation, alpha, limit)

  def project(inputs, kernel, bias):
    # The kernel's output in the compute dtype itself (it accumulates in float32 inside): a
    # float32 output followed by a cast is a float32 buffer XLA keeps (DeepSeek-V3's seven
    # GiB ones).
    if bias is None:
      return grouped_matmul.ragged_dot(inputs, kernel, group_sizes, x.dtype)
    y = grouped_matmul.ragged_dot(inputs, kernel, group_sizes, jnp.float32)
    return (y + jnp.take(bias, experts_of_rows, axis=0).astype(jnp.float32)).astype(x.dtype)
  gate = tag(project(x, weights.wi, weights.wi_bias), "mlp_in")
  up = tag(project(x, weights.wi_gate, weights.wi_gate_bias), "mlp_in")
  hidden = activate(gate, up, activation, alpha, limit)
  return project(hidden, weights.wo, None)


def _tiled_grouped(x: jax.Array, group_sizes: jax.Array, weights: ExpertWeights,
                   activation: ExpertActivation, alpha: float, limit: float,
                   tile: int = CPU_TILE_ROWS) -> jax.Array:
  """`run_grouped` as tiles of `tile` rows, each holding rows of one expert (each group
  padded to whole tiles with zero rows), multiplied by that expert's weights, gathered per
  tile: batched matmuls over (N + E x tile) rows at most, whatever the balance."""
  rows, dim = x.shape
  num_experts = group_sizes.shape[0]
  tiles = -(-(rows + num_experts * (tile - 1)) // tile)  # A static bound on the tiles.
  padded = (group_sizes + tile - 1) // tile * tile
  padded_ends = jnp.cumsum(padded)
  padded_starts, starts = padded_ends - padded, jnp.cumsum(group_sizes) - group_sizes
  # Each padded position's expert (num_experts past the last), and the row it holds.
  position = jnp.arange(tiles * tile)
  expert = jnp.searchsorted(padded_ends, position, side="right")
  clipped = jnp.minimum(expert, num_experts - 1)
  within = position - padded_starts[clipped]
  holds = (expert < num_experts) & (within < group_sizes[clipped])
  source = jnp.where(holds, starts[clipped] + within, rows)  # Row `rows`: zeros.
  blocks = jnp.take(jnp.concatenate([x, jnp.zeros((1, dim), x.dtype)]), source, axis=0)
  blocks = blocks.reshape(tiles, tile, dim)
  tile_expert = clipped[::tile]

  def project(inputs, kernel, bias):
    y = jnp.einsum("nti,nio->nto", inputs, jnp.take(kernel, tile_expert, axis=0),
                   preferred_element_type=jnp.float32)
    if bias is not None:
      y = y + jnp.take(bias, tile_expert, axis=0)[:, None].astype(jnp.float32)
    return y.astype(x.dtype)
  gate = tag(project(blocks, weights.wi, weights.wi_bias), "mlp_in")
  up = tag(project(blocks, weights.wi_gate, weights.wi_gate_bias), "mlp_in")
  hidden = activate(gate, up, activation, alpha, limit)
  out = jnp.einsum("nti,nio->nto", hidden, jnp.take(weights.wo, tile_expert, axis=0),
                   preferred_element_type=jnp.float32).astype(x.dtype).reshape(tiles * tile, dim)
  # Back to the rows: row r of expert e sits at padded_starts[e] + (r - starts[e]).
  row = jnp.arange(rows)
  row_expert = jnp.minimum(jnp.searchsorted(jnp.cumsum(group_sizes), row, side="right"),
                           num_experts - 1)
  at = padded_starts[row_expert] + row - starts[row_expert]
  at = jnp.where(row < jnp.sum(group_sizes), at, tiles * tile)  # Past the groups: zeros.
  return jnp.take(jnp.concatenate([out, jnp.zeros((1, dim), out.dtype)]), at, axis=0)


def output_bias(weights: ExpertWeights, experts: jax.Array, routing_weights: jax.Array,
                dtype: jnp.dtype) -> jax.Array | None:
  """sum_k weight_k x wo_bias[expert_k] for each token ([T, D]; None without biases): the
  output projection's bias, added once after any sum over shards."""
  if weights.wo_bias is None:
    return None
  return jnp.einsum("tkd,tk->td", jnp.take(weights.wo_bias, experts, axis=0).astype(
      jnp.float32), routing_weights.astype(jnp.float32)).astype(dtype)


def sorted_by_expert(experts: jax.Array, num_experts: int
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(order, group sizes [num_experts], each sorted row's expert) of assignments `experts`
  [T, k] with values in [0, num_experts]: the value num_experts (an expert elsewhere) sorts
  last and is in no group."""
  flat = experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  group_sizes = jnp.bincount(flat, length=num_experts + 1)[:num_experts].astype(jnp.int32)
  return order, group_sizes, jnp.minimum(jnp.take(flat, order), num_experts - 1)


def unsort(rows: jax.Array, order: jax.Array) -> jax.Array:
  """Rows of a sorted order back in the original order (row i of `rows` is row order[i])."""
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
  return jnp.take(rows, inverse, axis=0)


def weighted_sum(rows: jax.Array, routing_weights: jax.Array) -> jax.Array:
  """float32 [T, D]: each token's k rows [T, k, D] weighed by `routing_weights` [T, k] and
  summed, in float32 from the rows' own dtype (no float32 copy of the k rows is made; the
  weights are rounded to that dtype, as a bfloat16 model's other products are)."""
  return jnp.einsum("tkd,tk->td", rows, routing_weights.astype(rows.dtype),
                    preferred_element_type=jnp.float32)


def dropless(x: jax.Array, routing: Routing, weights: ExpertWeights,
             activation: ExpertActivation, alpha: float, limit: float) -> jax.Array:
  """Every assignment of x [T, D] through its expert, grouped by expert: [T, D]."""
  tokens, k = routing.experts.shape
  order, group_sizes, experts_of_rows = sorted_by_expert(routing.experts, weights.wi.shape[0])
  out = run_grouped(jnp.take(x, order // k, axis=0), group_sizes, experts_of_rows,
                    weights, activation, alpha, limit)
  y = weighted_sum(unsort(out, order).reshape(tokens, k, -1), routing.weights)
  bias = output_bias(weights, routing.experts, routing.weights, jnp.float32)
  return (y if bias is None else y + bias).astype(x.dtype)


def _run_stacked(x: jax.Array, weights: ExpertWeights, activation: ExpertActivation,
                 alpha: float, limit: float, spec: str) -> jax.Array:
  """The experts on x [..., E, (slots,) D] by batched einsums (`spec`: x's axes before D)."""
  def einsum(inputs, kernel):
    return jnp.einsum(f"{spec}i,eio->{spec}o", inputs, kernel,
                      preferred_element_type=jnp.float32)

  def with_bias(y, bias):
    if bias is None:
      return y.astype(x.dtype)
    return _add_expert_bias(y, bias, spec).astype(x.dtype)

  gate = tag(with_bias(einsum(x, weights.wi), weights.wi_bias), "mlp_in")
  up = tag(with_bias(einsum(x, weights.wi_gate), weights.wi_gate_bias), "mlp_in")
  hidden = activate(gate, up, activation, alpha, limit)
  return with_bias(einsum(hidden, weights.wo), weights.wo_bias)


def _add_expert_bias(y: jax.Array, bias: jax.Array, spec: str) -> jax.Array:
  """y [..spec.., out] plus each expert's bias [E, out] along spec's `e` axis."""
  axis = spec.index("e")
  shape = [1] * y.ndim
  shape[axis], shape[-1] = bias.shape
  return y + bias.astype(jnp.float32).reshape(shape)


def dense_reference(x: jax.Array, routing: Routing, weights: ExpertWeights,
                    activation: ExpertActivation, alpha: float, limit: float) -> jax.Array:
  """Every expert on every token of x [T, D], summed with the routing weights (zero for the
  experts a token did not choose): [T, D]."""
  num_experts = weights.wi.shape[0]
  combine = jnp.einsum("tk,tke->te", routing.weights,
                       jax.nn.one_hot(routing.experts, num_experts, dtype=jnp.float32))
  out = _run_stacked(jnp.broadcast_to(x[:, None], (x.shape[0], num_experts, x.shape[1])),
                     weights, activation, alpha, limit, "te")
  return jnp.einsum("ted,te->td", out, combine.astype(x.dtype),
                    preferred_element_type=jnp.float32).astype(x.dtype)


def capacity_dispatch(x: jax.Array, routing: Routing, weights: ExpertWeights,
                      factor: float, activation: ExpertActivation, alpha: float, limit: float
                      ) -> tuple[jax.Array, jax.Array]:
  """x [B, L, D] in groups of rows, each expert taking at most `capacity` assignments of a
  row (the module doc): ([B, L, D], the fraction of assignments dropped)."""
  rows, length, _ = x.shape
  num_experts = weights.wi.shape[0]
  k = routing.experts.shape[-1]
  slots = capacity(length, k, num_experts, factor)
  experts = routing.experts.reshape(rows, length, k)
  chosen = jax.nn.one_hot(experts, num_experts, dtype=jnp.int32)  # [B, L, k, E]
  # Priority: every first choice of the row, then every second, each in token order.
  by_choice = jnp.swapaxes(chosen, 1, 2).reshape(rows, k * length, num_experts)
  position = jnp.cumsum(by_choice, axis=1) - 1
  position = jnp.swapaxes(position.reshape(rows, k, length, num_experts), 1, 2)
  position = jnp.sum(position * chosen, axis=-1)  # [B, L, k]: the slot in its expert.
  kept = position < slots
  slot = jax.nn.one_hot(jnp.where(kept, position, slots), slots, dtype=jnp.float32)
  # [B, L, E, C]: a token chooses an expert at most once, so its k choices never collide.
  dispatch = jnp.einsum("blke,blkc->blec", chosen.astype(jnp.float32), slot)
  combine = jnp.einsum("blke,blkc,blk->blec", chosen.astype(jnp.float32), slot,
                       routing.weights.reshape(rows, length, k))
  dispatch = layers.constrain(dispatch, "batch", "length", "experts", None)
  inputs = jnp.einsum("blec,bld->becd", dispatch.astype(x.dtype), x)
  inputs = layers.constrain(inputs, "batch", "experts", None, "embed")
  out = _run_stacked(inputs, weights, activation, alpha, limit, "bec")
  out = layers.constrain(out, "batch", "experts", None, "embed")
  y = jnp.einsum("blec,becd->bld", combine.astype(x.dtype), out,
                 preferred_element_type=jnp.float32).astype(x.dtype)
  return y, 1.0 - jnp.mean(kept.astype(jnp.float32))
