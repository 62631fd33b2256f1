"""The compile report's pipeline section: the schedule, its bubble, and one stage's memory.

report.json `pipeline` (null without a stage axis):
  stages, microbatches, repeats, schedule ("gpipe" for one repeat, else "circular"),
  iterations (microbatches x repeats + stages - 1, the loop's trips),
  bubble_fraction and bubble_formula ("(stages - 1) / (microbatches x repeats + stages - 1)":
  the share of the loop each stage computes nothing it keeps; models/pipeline.py),
  layers_per_stage (in `repeats` blocks), replica_rows (the rows of one data-parallel
  replica's batch, which the microbatches divide), stage_bytes: one stage's bytes per device (each
  device holds one stage, so the report's per-device bytes are a stage's), of which
  stage_layer_parameter_bytes (the stage's share of the stacked layers, after any fsdp or
  tensor split) and other_parameter_bytes (embedding, output, norms: on every stage).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

BUBBLE_FORMULA = "(stages - 1) / (microbatches x repeats + stages - 1)"
# Above this share of the loop in the bubble, the line says the step is bubble-bound.
BUBBLE_BOUND = 0.5


def _parameter_bytes(abstract_params: Any) -> tuple[int, int]:
  """(bytes of the stacked layers' shards, bytes of the other parameters' shards) per device."""
  stacked = other = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params)[0]:
    value = getattr(leaf, "value", leaf)
    size = math.prod(value.sharding.shard_shape(value.shape)) * np.dtype(value.dtype).itemsize
    first = getattr(path[0], "key", None) if path else None
    if first == "layers":
      stacked += size
    else:
      other += size
  return stacked, other


def section(jitted: Any, stage_bytes: int | None) -> dict[str, Any] | None:
  """The section of a compile of `jitted` (on_mesh/jitted.py's JittedSteps), whose deciding
  bytes per device are `stage_bytes`."""
  pipeline = jitted.pipeline
  if pipeline is None:
    return None
  stacked, other = _parameter_bytes(jitted.sharded_state.abstract.params)
  setup = jitted.setup
  model = setup.model
  rows = setup.train_data.global_batch_size // (
      setup.train.grad_accum_steps
      * setup.partitioner.data_parallel_size(dict(jitted.mesh.shape)))
  return {"stages": pipeline.stages, "microbatches": pipeline.microbatches,
          "repeats": pipeline.repeats,
          "schedule": "gpipe" if pipeline.repeats == 1 else "circular",
          "iterations": pipeline.iterations, "bubble_fraction": pipeline.bubble_fraction,
          "bubble_formula": BUBBLE_FORMULA,
          "layers_per_stage": (model.num_layers - model.scan_prefix()) // pipeline.stages,
          "replica_rows": rows, "stage_bytes": stage_bytes, "stage_layer_parameter_bytes": stacked,
          "other_parameter_bytes": other}


def _mib(count: int | None) -> str:
  return "n/a" if count is None else f"{count / 2**20:.3f} MiB"


def lines(pipeline: dict[str, Any] | None, estimate: dict[str, Any] | None = None
          ) -> list[str]:
  """The section in words; where no step-time estimate was made to say what dominates, a
  bubble over half the loop is named bubble-bound here, with the next knob."""
  if not pipeline:
    return []
  stages, micro, repeats = pipeline["stages"], pipeline["microbatches"], pipeline["repeats"]
  blocks = f" in {repeats} blocks" if repeats > 1 else ""
  out = [f"  pipeline: {pipeline['schedule']}, {stages} stages x {micro} microbatches x "
         f"{repeats} repeat(s), {pipeline['iterations']} iterations; bubble "
         f"{pipeline['bubble_fraction']:.1%} of the loop ({pipeline['bubble_formula']})",
         f"    per stage: {pipeline['layers_per_stage']} layers{blocks}; "
         f"{_mib(pipeline['stage_bytes'])} per device (a device holds one stage), of which "
         f"its layers' parameters {_mib(pipeline['stage_layer_parameter_bytes'])} and the "
         f"parameters every stage holds {_mib(pipeline['other_parameter_bytes'])}"]
  if pipeline["bubble_fraction"] > BUBBLE_BOUND and not (estimate or {}).get("made"):
    out.append(f"  bubble-bound: {pipeline['bubble_fraction']:.0%} of the loop idles; next "
               f"knob: more microbatches (train.pipeline_microbatches, a divisor of the "
               f"{pipeline['replica_rows']} rows of each replica's batch), circular repeats "
               "(train.pipeline_repeats), or fewer stages (partitioner.ici_stage)")
  return out
