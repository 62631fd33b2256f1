"""The compile report's step-time bound: the step at 100% and 50% of the peak FLOPs.

Not an estimate (estimate_report.py counts the optimized HLO): a yardstick that needs nothing
but the model's FLOPs and a peak, kept beside the estimate so a report reads against either.
An "int8" train step's bound puts the blocks' weight matmuls at the int8 peak.
"""

from __future__ import annotations

from typing import Any

from lingvo_lite import mfu
from lingvo_lite.programs.compile import analyses


def section(target: Any, setup: Any, program: str, model_flops: float,
            tokens: int) -> dict[str, Any]:
  """The report's `step_time` section (schema: compile_report.py)."""
  peak, peak_source = _peak(target, setup)
  at_full = model_flops / (target.num_devices * peak)
  step_time = {"peak_flops_per_device": peak, "peak_source": peak_source,
               "seconds_at_100_mfu": at_full, "seconds_at_50_mfu": 2 * at_full,
               "tokens_per_s_per_device_at_50_mfu": tokens / (2 * at_full) / target.num_devices}
  if program == "train" and getattr(setup.model, "quantization", None) == "int8":
    step_time["int8"] = _int8_step_time(setup.model, target, model_flops, tokens, peak)
  return step_time


def _int8_step_time(model: Any, target: Any, model_flops: float, tokens: int,
                    peak: float) -> dict[str, Any]:
  """An "int8" train step's time at 50% of the peaks: the blocks' weight matmuls (forward
  and both gradients: 6 FLOPs per weight and token) at the target's int8 peak, the rest
  (attention's scores and values, the unembedding, in the compute dtype) at `peak`."""
  int8_peak = (target.peak_int8_tops or 0) * 1e12 or None
  int8_flops = 6.0 * model.block_matmul_parameters() * tokens
  if int8_peak is None:
    return {"peak_ops_per_device": None, "int8_flops_per_step": int8_flops,
            "seconds_at_50_mfu": None, "tokens_per_s_per_device_at_50_mfu": None}
  at_full = (int8_flops / int8_peak + (model_flops - int8_flops) / peak) / target.num_devices
  return {"peak_ops_per_device": int8_peak, "int8_flops_per_step": int8_flops,
          "seconds_at_50_mfu": 2 * at_full,
          "tokens_per_s_per_device_at_50_mfu": tokens / (2 * at_full) / target.num_devices}


def _peak(target, setup) -> tuple[float, str]:
  """Datasheet peak per device; virtual CPU devices share this host's measured peak."""
  if setup.train.peak_tflops_per_device:
    return setup.train.peak_tflops_per_device * 1e12, "configured"
  if target.peak_bf16_tflops:
    return target.peak_bf16_tflops * 1e12, f"{target.device_kind} bf16 datasheet"
  if target.platform == "cpu":
    flops, _ = mfu.host_matmul_peak(analyses.cache_folder())
    return (flops / target.num_devices,
            f"this host's best float32 2048^3 matmul shared by {target.num_devices} devices")
  return mfu.peak_flops_per_device(target.devices[0])


def lines(report: dict[str, Any]) -> list[str]:
  """The bound in words, then the matmuls' kinds and an "int8" step's bound."""
  s = report["step_time"]
  tokens = s["tokens_per_s_per_device_at_50_mfu"]
  return [f"  bound for comparison (not an estimate): at 100% MFU "
          f"{s['seconds_at_100_mfu'] * 1e3:.4g} ms, at 50% "
          f"{s['seconds_at_50_mfu'] * 1e3:.4g} ms ({tokens:,.0f} tokens/s per device); "
          f"peak {s['peak_flops_per_device'] / 1e12:.4g} TFLOP/s per device "
          f"({s['peak_source']})"] + int8_lines(report)


def int8_lines(report: dict[str, Any]) -> list[str]:
  """The matmuls' kinds in the optimized HLO, and an "int8" step's time."""
  lines = []
  dots = report.get("dots")
  if dots:
    lines.append(f"  matmuls in the optimized HLO: {dots['int8']} int8, {dots['float']} float "
                 "(instructions; a loop body counts once)")
  int8 = report["step_time"].get("int8")
  if int8 is not None:
    if int8["seconds_at_50_mfu"] is None:
      lines.append(f"  int8 step time: n/a (no int8 peak known for "
                   f"{report['target']['device_kind']})")
    else:
      seconds = int8["seconds_at_50_mfu"]
      tokens = int8["tokens_per_s_per_device_at_50_mfu"]
      speedup = report["step_time"]["seconds_at_50_mfu"] / seconds
      lines.append(f"  int8 step time at 50% of the peaks {seconds * 1e3:.4g} ms ({tokens:,.0f} "
                   f"tokens/s per device; {speedup:.2f}x the step at the bf16 peak): the "
                   "blocks' weight matmuls "
                   f"({int8['int8_flops_per_step']:.4g} FLOPs per step) at the int8 peak of "
                   f"{int8['peak_ops_per_device'] / 1e12:.4g} TOP/s per device, the rest at "
                   "the bf16 peak")
  return lines
