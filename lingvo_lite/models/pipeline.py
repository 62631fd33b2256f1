"""Pipeline parallelism over a scanned layer stack: the schedule as one SPMD loop.

The scanned stack's G groups of layers (models/transformer_layers.py: a group is one layer, or
one period of the attention-kind pattern) are cut into `stages` x `repeats` pieces of
G / (stages x repeats) consecutive groups. Stage s holds pieces s, s + stages, s + 2 stages,
...: with `repeats` 1 that is one contiguous block (GPipe); with more, `repeats` non-adjacent
blocks (the circular schedule, MaxText's `num_pipeline_repeats`), which divides the bubble by
`repeats` for as many more transfers of activations.

The batch is cut into `microbatches` (row i of microbatch m is batch row i x M + m, so each
microbatch keeps the batch's sharding over the data axes). One loop of M x R + S - 1
iterations runs every stage at once (`jax.vmap` over the stage axis, sharded on the `stage`
mesh axis): at iteration t stage s computes microbatch (t - s) mod M of its repeat
(t - s) // M, then the activations shift one stage on (`jnp.roll` over the stage-sharded
buffer: a collective-permute, the loop's only transfer between stages; on XLA:CPU the loops
are unrolled, `_unrolled`). The shift brings
stage 0 the last stage's output, which stage 0 holds (a buffer of M microbatches) until the
next repeat reads it or the loop returns it. Stage 0 reads a new microbatch while t < M, after
that (the circular schedule) the held output of the previous repeat (so the circular schedule
needs M >= S). Iterations where a stage has
nothing to do (t < s, or t - s >= M x R) compute on stale activations and are thrown away: the
bubble, (S - 1) / (M x R + S - 1) of the loop.

Parameters stay stored as the scan stores them, [G, ...] in layer order (a checkpoint does not
depend on the stage count); the loop reshapes them to [R, S, G / (R S), ...] inside the step.
The rules map the `layers` axis to `stage`, so for GPipe each device already holds its stage's
contiguous rows; the circular schedule's reshape moves rows between stages each step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from lingvo_lite import target as targets
from lingvo_lite.errors import config_error

STAGE_AXIS = "stage"
# A group's function: (its variables, x [rows, length, dim], positions, segment ids, dropout
# key or None) -> (x, the statistics it sowed: a tree of arrays).
GroupFunction = Callable[[Any, jax.Array, jax.Array, Any, Any], tuple[jax.Array, Any]]


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
  """A pipeline's shape (set by the programs from the partitioner and `train`, never by a
  model's config).

  Attributes:
    stages: S, the `stage` mesh axis's size.
    microbatches: M, the pieces of each (accumulation) batch the schedule streams.
    repeats: R, the layer blocks each stage holds (1: GPipe; more: circular).
  """

  stages: int
  microbatches: int = 1
  repeats: int = 1

  @property
  def iterations(self) -> int:
    """The loop's trips: M x R + S - 1."""
    return self.microbatches * self.repeats + self.stages - 1

  @property
  def bubble_fraction(self) -> float:
    """The share of the loop a stage idles: (S - 1) / (M x R + S - 1)."""
    return (self.stages - 1) / self.iterations


def check(settings: PipelineSettings, scan_layers: bool, num_layers: int, period: int,
          rows: int | None, prefix: int = 0) -> None:
  """Raises UsageError (naming the field) where the pipeline cannot run this model and batch.

  Args:
    settings: The pipeline.
    scan_layers: model.scan_layers (the pipeline cuts the scanned stack).
    num_layers: model.num_layers.
    period: The layers of one scanned group (the kind pattern's period).
    rows: The rows of one data-parallel replica's (accumulation) batch; None where the batch
      does not split over the replicas (refused by the caller, naming the batch size).
    prefix: The first layers, unrolled before the scanned ones (`scan_prefix`: DeepSeek's
      dense layers); they run on every stage before the pipeline, as the embedding does.
  """
  stages, micro, repeats = settings.stages, settings.microbatches, settings.repeats
  if not scan_layers:
    raise config_error("model.scan_layers", scan_layers, f"a pipeline of {stages} stages "
                       "(partitioner.ici_stage x dcn_stage) cuts the scanned layer stack",
                       "set --fdl.model.scan_layers=True")
  pieces = stages * repeats
  if (num_layers - prefix) % (period * pieces):
    kinds = f" in groups of the layer pattern's period {period}" if period > 1 else ""
    layers = (f"the {num_layers - prefix} layers of model.num_layers={num_layers} after the "
              f"first {prefix} (unrolled before the scan)" if prefix
              else f"model.num_layers={num_layers}")
    fix = (f"make num_layers - {prefix} a multiple of {period * pieces}" if prefix
           else f"make num_layers a multiple of {period * pieces}")
    raise config_error("partitioner.ici_stage", stages, f"{stages} stages x "
                       f"{repeats} repeats (train.pipeline_repeats) do not divide "
                       f"{layers}{kinds}", fix)
  if rows is not None and rows % micro:
    raise config_error("train.pipeline_microbatches", micro, f"does not divide the {rows} "
                       "rows of each data-parallel replica's batch",
                       "use a divisor of global_batch_size / (grad_accum_steps x "
                       "data-parallel size)")
  if repeats > 1 and micro < stages:
    raise config_error("train.pipeline_microbatches", micro, f"the circular schedule "
                       f"(train.pipeline_repeats={repeats}) needs at least as many "
                       f"microbatches as stages ({stages})", f"use at least {stages}")


def _stage_mesh_size() -> int:
  """The active mesh's `stage` axis (1 without a mesh or that axis)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or STAGE_AXIS not in mesh.axis_names:
    return 1
  return mesh.shape[STAGE_AXIS]


def _on_stages(tree: Any, dim: int) -> Any:
  """`tree`'s arrays split over the stage mesh axis on dimension `dim`, the others left to
  the compiler (UNCONSTRAINED: fsdp and tensor splits of the weights stay as they are)."""
  if _stage_mesh_size() == 1:
    return tree

  def one(a: jax.Array) -> jax.Array:
    spec = [PartitionSpec.UNCONSTRAINED] * a.ndim
    spec[dim] = STAGE_AXIS
    return jax.lax.with_sharding_constraint(a, PartitionSpec(*spec))
  return jax.tree.map(one, tree)


def _microbatched(a: Any, micro: int, *axes: str | None) -> Any:
  """[B, ...] -> [M, B / M, ...], microbatch m holding rows m, m + M, ... (the data axes'
  split of the batch stays on the rows; `axes`, the logical names of the dimensions after
  the batch's, keep theirs: the residual stream's width split as between layers)."""
  if a is None:
    return None
  split = a.reshape(a.shape[0] // micro, micro, *a.shape[1:])
  split = jnp.swapaxes(split, 0, 1)
  return nn.with_logical_constraint(split, (None, "batch") + (axes or (None,) * (a.ndim - 1)))


def _unmicrobatched(a: jax.Array) -> jax.Array:
  """The inverse of `_microbatched`."""
  return jnp.swapaxes(a, 0, 1).reshape(-1, *a.shape[2:])


def _unrolled() -> bool:
  """Whether the loops are unrolled: on XLA:CPU, whose thunks run concurrently, a while loop
  holding collectives (the shift, a layer's gradient reduction over the data axis) is not
  ordered against a collective outside it that it does not depend on (the output layer's
  gradient reduction); devices met the two in different orders and waited on each other
  until the 40 s rendezvous timeout killed the process (8 forced CPU devices, stage 2 x
  data 4). Unrolled, every collective is in one sequence, which XLA:CPU runs in order. An
  accelerator runs each device's collectives in one stream, and keeps the loops."""
  return _stage_mesh_size() > 1 and targets.current_platform() == "cpu"


def _stage_function(group: GroupFunction) -> Callable[..., tuple[jax.Array, Any]]:
  """One stage's work at one iteration: its groups of layers in order (a scan over them),
  the statistics stacked over its groups."""
  def stage(variables: Any, x: jax.Array, positions: jax.Array, segment_ids: Any,
            key: Any) -> tuple[jax.Array, Any]:
    def one(carry, indexed):
      index, group_variables = indexed
      group_key = None if key is None else jax.random.fold_in(key, index)
      return group(group_variables, carry, positions, segment_ids, group_key)
    count = jax.tree.leaves(variables)[0].shape[0]
    return jax.lax.scan(one, x, (jnp.arange(count), variables), unroll=_unrolled())
  return stage


def _iteration(stage_fn: Callable[..., Any], staged: Any, inputs: jax.Array,
               positions: jax.Array, segment_ids: Any, settings: PipelineSettings,
               key: Any) -> Callable[..., Any]:
  """One iteration of the loop (the module doc) as a scan body over the carry (the stages'
  inputs, the outputs stage 0 holds, the statistics' sums) and the iteration's index t."""
  stages, micro, repeats = settings.stages, settings.microbatches, settings.repeats
  stage_index = jnp.arange(stages)

  def iteration(carry, t):
    buffer, held, sums = carry
    first = jnp.where(t < micro, inputs[t % micro][None], held[:, t % micro])
    buffer = jnp.where((stage_index == 0)[:, None, None, None], first, buffer)
    done = t - stage_index  # Each stage's count of (microbatch, repeat) pairs before this one.
    valid = (done >= 0) & (done < micro * repeats)
    mb, repeat = done % micro, jnp.clip(done // micro, 0, repeats - 1)
    stage_variables = jax.vmap(lambda v, r: jax.tree.map(lambda a: a[r], v),
                               in_axes=(1, 0))(staged, repeat)
    keys = None if key is None else jax.vmap(
        lambda m, r: jax.random.fold_in(key, r * micro + m))(mb, repeat)
    out, stats = stage_fn(stage_variables, _on_stages(buffer, 0), _pick(positions, mb),
                          _pick(segment_ids, mb), keys)
    # The shift brings stage 0 the last stage's output: held there (and only there) until a
    # later repeat reads it, or the loop returns it. No other transfer between stages happens
    # inside the loop, so each iteration's collectives follow one another (on XLA:CPU, whose
    # thunks run concurrently, two independent ones could wait on each other forever).
    buffer = jnp.roll(out, 1, axis=0)
    finished = t - (stages - 1)
    keep = (stage_index == 0) & (finished >= 0) & (finished < micro * repeats)
    held = held.at[:, finished % micro].set(
        jnp.where(keep[:, None, None, None], buffer, held[:, finished % micro]))
    # Each stage's statistics, kept where it computed something, into its repeat's row.
    chosen = valid[None, :] & (jnp.arange(repeats)[:, None] == repeat[None, :])
    sums = jax.tree.map(
        lambda total, s: total + jnp.where(
            chosen.reshape(chosen.shape + (1,) * (s.ndim - 1)), s[None], 0).astype(total.dtype),
        sums, stats)
    return (buffer, held, sums), None
  return iteration


def _pick(tree: Any, index: jax.Array) -> Any:
  return None if tree is None else jnp.take(tree, index, axis=0)


def run(group: GroupFunction, variables: Any, x: jax.Array, positions: jax.Array,
        segment_ids: jax.Array | None, settings: PipelineSettings, key: Any = None
        ) -> tuple[jax.Array, Any]:
  """The scanned stack's output for `x` [B, T, D] through the schedule (the module doc).

  Args:
    group: One group of layers as a function (`GroupFunction`).
    variables: The stack's variables, every leaf [G, ...] in layer order.
    x, positions, segment_ids: The stack's input, [B, T, D], [B, T] and [B, T] (or None).
    settings: The pipeline.
    key: The dropout key, or None: each (microbatch, group) draws its own from it.

  Returns:
    The output [B, T, D], and the sown statistics, each leaf [G, ...]: a group's mean over
    the microbatches.
  """
  stages, micro, repeats = settings.stages, settings.microbatches, settings.repeats
  groups = jax.tree.leaves(variables)[0].shape[0]
  per_piece = groups // (stages * repeats)
  # [G, ...] -> [R, S, G / (R S), ...]: piece r x S + s is stage s's block of repeat r.
  staged = _on_stages(jax.tree.map(
      lambda a: a.reshape(repeats, stages, per_piece, *a.shape[1:]), variables), 1)
  inputs = _microbatched(x, micro, "length", "activation_embed")
  positions, segment_ids = _microbatched(positions, micro), _microbatched(segment_ids, micro)
  stage_index = jnp.arange(stages)
  stage_fn = jax.vmap(_stage_function(group),
                      spmd_axis_name=STAGE_AXIS if _stage_mesh_size() > 1 else None)

  iteration = _iteration(stage_fn, staged, inputs, positions, segment_ids, settings, key)
  buffer = _on_stages(jnp.zeros((stages,) + inputs.shape[1:], x.dtype), 0)
  held = _on_stages(jnp.zeros((stages,) + inputs.shape, x.dtype), 0)
  stat_shapes = jax.eval_shape(stage_fn, jax.tree.map(lambda a: a[0], staged),
                               buffer, _pick(positions, stage_index % micro),
                               _pick(segment_ids, stage_index % micro),
                               None if key is None else jax.random.split(key, stages))[1]
  sums = jax.tree.map(lambda s: jnp.zeros((repeats,) + s.shape, jnp.float32), stat_shapes)
  (_, held, sums), _ = jax.lax.scan(iteration, (buffer, held, sums),
                                    jnp.arange(settings.iterations), unroll=_unrolled())
  outputs = held[0]
  statistics = jax.tree.map(
      lambda total, s: (total / micro).reshape(groups, *s.shape[2:]).astype(s.dtype),
      sums, stat_shapes)
  return _unmicrobatched(outputs), statistics
