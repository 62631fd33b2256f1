"""The compile report's step-time estimate: report.json's `estimate` section and its lines.

The estimate is the optimized HLO counted on the target chip's constants (step_estimate.py,
lingvo_lite/chips.py); this module turns what the compile kept into the step time, the MFU it
implies, each part's time, the part that dominates, and, where that part is not the
matmuls, the knob that moves it.

report.json `estimate` (null for a program that did not compile, or where nothing was asked):
  made: whether there is an estimate; reason (when not made)
  seconds, tokens_per_s_per_device, mfu (model FLOPs per device over seconds x the chip's
  datasheet peak)
  parts: {compute, memory, ici, dcn, bubble} seconds the step waits for each
  overlapped: {part: seconds} asynchronous work hidden behind kernels
  dominant: the largest part; bound: the dominant part where it is not "compute", else null;
  next_knob: what to change for a bound config (null otherwise)
  counted: matmul_flops, hbm_bytes, ici_bytes, dcn_bytes, kernels (per device)
  pipeline: stages, microbatches, repeats, bubble_fraction
  chip: name and each constant with its source; dcn_unknown (a DCN transfer on a chip
  whose DCN bandwidth is unpublished: not counted)
"""

from __future__ import annotations

from typing import Any

from lingvo_lite import chips
from lingvo_lite.experiment import pipeline_settings
from lingvo_lite.programs.compile import step_estimate

# What moves a step bound by each part, in the config's own fields.
KNOBS = {
    "memory": "memory-bound: raise the per-device batch (train_data.global_batch_size) so the "
              "matmuls outweigh the optimizer's and the activations' HBM traffic, or a remat "
              "policy that saves fewer activations",
    "ici": "ICI-bound: less tensor parallelism (partitioner.ici_tensor) for more fsdp or data, "
           "or raise the per-device batch",
    "dcn": "DCN-bound: shard the optimizer over the slices (partitioner.dcn_fsdp) so fewer "
           "bytes cross them, or raise the per-device batch",
    "bubble": "bubble-bound: more microbatches (train.pipeline_microbatches), circular "
              "repeats, or fewer stages",
}


def pipeline_of(setup: Any, num_devices: int) -> tuple[int, int, int]:
  """(stages, microbatches, repeats) of a setup's pipeline on `num_devices`: the `stage` mesh
  axis (`partitioner.ici_stage` x `dcn_stage`) over `train.pipeline_microbatches`, with
  `train.pipeline_repeats` (1, 1, 1 without one: experiment.pipeline_settings)."""
  pipeline = pipeline_settings(setup, num_devices)
  if pipeline is None:
    return 1, 1, 1
  return pipeline.stages, pipeline.microbatches, pipeline.repeats


def _not_made(reason: str) -> dict[str, Any]:
  return {"made": False, "reason": reason}


def section(kept: dict[str, Any] | None, device_kind: str, model_flops_per_device: float,
            tokens_per_device: float, pipeline: tuple[int, int, int] = (1, 1, 1)
            ) -> dict[str, Any]:
  """report.json's `estimate` of one compile (`kept`: aot.Compiled.estimate)."""
  chip = chips.chip_of(device_kind)
  if chip is None:
    return _not_made(f"no chip constants for {device_kind} (lingvo_lite/chips.py has "
                     f"{', '.join(chips.CHIPS)})")
  if kept is None:
    return _not_made("XLA gave no program to count (the step does not fit)")
  if "error" in kept:
    return _not_made(f"the optimized HLO could not be counted ({kept['error']})")
  stages, microbatches, repeats = pipeline
  parts = step_estimate.pipelined(kept, stages, microbatches, repeats)
  seconds = sum(parts.values())
  if seconds <= 0:
    return _not_made("the optimized HLO holds no kernel to count")
  dominant = max(parts, key=lambda part: parts[part])
  return {
      "made": True, "seconds": seconds,
      "tokens_per_s_per_device": tokens_per_device / seconds,
      "mfu": model_flops_per_device / (seconds * chip.peak_flops.value),
      "parts": parts, "overlapped": {k: v for k, v in kept["hidden"].items() if v},
      "dominant": dominant, "bound": None if dominant == "compute" else dominant,
      "next_knob": KNOBS.get(dominant),
      "counted": {"matmul_flops": kept["flops"], "hbm_bytes": kept["hbm_bytes"],
                  "ici_bytes": kept["ici_bytes"], "dcn_bytes": kept["dcn_bytes"],
                  "kernels": kept["kernels"]},
      "pipeline": {"stages": stages, "microbatches": microbatches, "repeats": repeats,
                   "bubble_fraction": parts["bubble"] / seconds},
      "chip": _constants(chip), "dcn_unknown": bool(kept.get("unknown_dcn")),
  }


def _constants(chip: chips.Chip) -> dict[str, Any]:
  figures = {"peak_flops": chip.peak_flops, "matmul_flops": chip.matmul_flops,
             "hbm_bytes_per_s": chip.hbm_bytes_per_s,
             "hbm_read_bytes_per_s": chip.hbm_read_bytes_per_s,
             "ici_link_bytes_per_s": chip.ici_link_bytes_per_s,
             "dcn_bytes_per_s": chip.dcn_bytes_per_s, "op_overhead_s": chip.op_overhead_s}
  return {"name": chip.name, "mxu_edge": chip.mxu_edge, "ici_links": chip.ici_links,
          **{name: None if f is None else {"value": f.value, "source": f.source}
             for name, f in figures.items()}}


def _ms(seconds: float) -> str:
  return f"{seconds * 1e3:.4g} ms"


def _bytes(count: float) -> str:
  for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
    if count >= size:
      return f"{count / size:.3g} {unit}"
  return f"{count:.0f} B"


def lines(estimate: dict[str, Any] | None) -> list[str]:
  """The estimate in words (nothing for a report without the section)."""
  if not estimate:
    return []
  if not estimate["made"]:
    return [f"  step time estimate: none: {estimate['reason']}"]
  parts, seconds, chip = estimate["parts"], estimate["seconds"], estimate["chip"]
  shown = ", ".join(
      f"{name if name in ('compute', 'memory', 'bubble') else name.upper()} {_ms(value)}"
      + (f" ({value / seconds:.0%}, dominates)" if name == estimate["dominant"] else "")
      for name, value in parts.items() if value or name in ("compute", "memory"))
  hidden = ", ".join(f"{k} {_ms(v)}" for k, v in estimate["overlapped"].items())
  counted = estimate["counted"]
  out = [f"  step time estimate: {_ms(seconds)} ({estimate['tokens_per_s_per_device']:,.0f} "
         f"tokens/s per device, MFU {estimate['mfu']:.1%} of {chip['name']}'s "
         f"{chip['peak_flops']['value'] / 1e12:.4g} TFLOP/s): the optimized HLO counted on "
         f"{chip['name']}'s constants (lingvo_lite/chips.py)",
         f"    {shown}" + (f"; overlapped with kernels: {hidden}" if hidden else ""),
         f"    counted per device: {counted['matmul_flops'] / 1e12:.4g} TFLOP of matmuls, "
         f"{_bytes(counted['hbm_bytes'])} of HBM traffic, {_bytes(counted['ici_bytes'])} "
         f"over ICI, {_bytes(counted['dcn_bytes'])} over DCN, {counted['kernels']:,.0f} "
         "kernels (loops counted per trip)"]
  pipeline = estimate["pipeline"]
  if pipeline["stages"] > 1:
    out.append(f"    pipeline: {pipeline['stages']} stages x {pipeline['microbatches']} "
               f"microbatches (x {pipeline['repeats']} repeats): bubble "
               f"{pipeline['bubble_fraction']:.1%} of the step")
  if estimate["dcn_unknown"]:
    out.append(f"    DCN transfers not counted: no published DCN bandwidth for {chip['name']}")
  if estimate["bound"]:
    out.append(f"  {estimate['next_knob']}")
  return out
