"""MFU of lingvo_lite's train step on an accelerator, against its datasheet and a measured peak.

  python bench/accelerator_mfu.py [--experiment Llama1BOneChip] [--steps 10]
      [--set "model.attention_implementation='einsum'" ...]
      [--variant "NAME:PATH=VALUE;PATH=VALUE" ...] [--json FILE]

A variant's `splash.FIELD=VALUE` (block_q=1024, block_kv_compute=512, use_fused_bwd_kernel=
False, k_layout=SEQ_MINOR: a field of the splash kernel's BlockSizes) sets that field over the
block edge models/flash_attention.py picks, for that row only: how the kernel is tuned here.

Builds the experiment (synthetic data: nothing but jax, flax, optax, orbax and fiddle is
imported) with the `--set` overrides, then for each `--variant` (default: one, the experiment
as set) applies the variant's own overrides on top, compiles its train step, runs two warm-up
steps and `--steps` timed ones, and prints a row: step time (median), tokens/s, model TFLOP/s
per device (mfu.py's formula), MFU against the device's datasheet bf16 peak, and the device's
peak memory (its allocator's high-water mark, where the backend reports one). A variant that
does not fit (RESOURCE_EXHAUSTED) is a row saying so, and the next one runs: all variants share
one process, so the chip is opened once and the rows are measured side by side. Last, the
best of 10 bfloat16 --matmul_size^3 matmuls gives a measured peak to set beside the datasheet.
On a CPU it runs too, with small overrides and a small `--matmul_size`; the datasheet column
is then the measured float32 peak, as in training logs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import jax
import numpy as np

from bench import timed_steps
from lingvo_lite import chips, executor, mfu
from lingvo_lite.models import flash_attention
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.programs.compile import step_estimate
# pylint: enable=wrong-import-position


def _parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--experiment", default="Llama1BOneChip")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--matmul_size", type=int, default=8192)
  parser.add_argument("--set", action="append", default=[],
                      help="PATH=VALUE override of the experiment's config; repeatable")
  parser.add_argument("--variant", action="append", default=[],
                      help="NAME:PATH=VALUE;PATH=VALUE: a row measured with these overrides "
                           "on top of --set; repeatable")
  parser.add_argument("--json", help="also write the rows to this file (JSON lines)")
  parser.add_argument("--splash_block", type=int,
                      help="the splash kernel's largest block edge (models/flash_attention.py's "
                           "BLOCK_SIZES and NARROW_HEAD_BLOCK_SIZES: 512, and 1024 for heads "
                           "of 64), for every row")
  return parser.parse_args()


def _variants(specs: list[str]) -> list[tuple[str, list[str]]]:
  if not specs:
    return [("as set", [])]
  variants = []
  for spec in specs:
    name, _, sets = spec.partition(":")
    variants.append((name, [s for s in sets.split(";") if s.strip()]))
  return variants


def _splash_overrides(sets: list[str]) -> tuple[list[str], dict]:
  """(the config overrides, the splash BlockSizes fields) of one variant's sets."""
  # pylint: disable-next=import-outside-toplevel
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
  overrides, fields = [], {}
  for item in sets:
    path, _, value = item.partition("=")
    if not path.strip().startswith("splash."):
      overrides.append(item)
      continue
    name, value = path.strip()[len("splash."):], value.strip()
    if name.endswith("_layout"):
      fields[name] = kernel.QKVLayout[value]
    elif value in ("True", "False"):
      fields[name] = value == "True"
    else:
      fields[name] = int(value)
  return overrides, fields


def measure(experiment: str, sets: list[str], steps: int) -> dict:
  """One variant's row (raises what the compile or the steps raise)."""
  sets, flash_attention.BLOCK_OVERRIDES = _splash_overrides(sets)
  setup = executor.build_experiment(experiment, sets)
  jitted = JittedSteps(setup)
  data, model = setup.train_data, setup.model
  with jitted.activated():
    started = time.perf_counter()
    compiled = jitted.train_step.lower(jitted.sharded_state.abstract,
                                       jitted.abstract_batch()).compile()
    compile_s = time.perf_counter() - started
    state = jitted.init_state()
    batch = jitted.global_batch(data.batch(0, jax.process_index(), jax.process_count()))
    step_times, state, metrics = timed_steps.each_step_seconds(compiled, state, batch, steps)
    attention = model.resolved_attention_implementation()
  step_time = statistics.median(step_times)
  devices = jax.device_count()
  flops = mfu.model_flops_per_step(model, data.global_batch_size, data.sequence_length)
  achieved = flops / step_time / devices
  datasheet, _ = mfu.peak_flops_per_device(jax.devices()[0])
  analysis = compiled.memory_analysis()
  predicted = None if analysis is None else (
      analysis.argument_size_in_bytes + analysis.output_size_in_bytes
      - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)
  row = {"batch": data.global_batch_size, "length": data.sequence_length,
         "remat": model.remat_policy, "attention": attention,
         "scan_layers": getattr(model, "scan_layers", None), "compile_s": compile_s,
         "step_ms": step_time * 1e3, "tokens_per_s": data.global_batch_size
         * data.sequence_length / step_time, "tflops_per_device": achieved / 1e12,
         "mfu": achieved / datasheet, "loss": float(np.asarray(metrics["loss"])),
         "xla_memory_gib": None if predicted is None else predicted / 2**30,
         "parameters": model.num_parameters(), **_estimate(compiled, jitted, step_time)}
  del state, metrics, compiled, jitted
  return row


def _estimate(compiled, jitted: JittedSteps, step_time: float) -> dict:
  """The compile report's step-time estimate of this very executable (its optimized HLO on
  the chip's constants, programs/compile/step_estimate.py) beside the measured step; {} where
  lingvo_lite/chips.py has no constants for the device."""
  chip = chips.chip_of(jax.devices()[0].device_kind)
  if chip is None:
    return {}
  estimate = step_estimate.estimate(compiled.as_text(), chip, tuple(jitted.mesh.devices.flat))
  return {"estimate_ms": estimate.total * 1e3, "estimate_error": estimate.total / step_time - 1,
          "estimate_parts_ms": {part: seconds * 1e3 for part, seconds
                                in estimate.seconds.items() if seconds}}


def main() -> None:
  args = _parse_args()
  if args.splash_block:
    flash_attention.BLOCK_SIZES = flash_attention.NARROW_HEAD_BLOCK_SIZES = (
        args.splash_block, *(size for size in (512, 256, 128) if size < args.splash_block))
  device = jax.devices()[0]
  print(f"jax {jax.__version__}, {jax.device_count()} x {device.device_kind}; "
        f"{args.experiment} with {args.set or 'no overrides'}", flush=True)
  rows = []
  for name, sets in _variants(args.variant):
    try:
      row = measure(args.experiment, [*args.set, *sets], args.steps)
    except Exception as e:  # pylint: disable=broad-except  # A row per variant, whatever fails.
      text = str(e).splitlines()[0] if str(e) else type(e).__name__
      fits = "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower()
      row = {"error": text[:300], "fits": fits}
    row = {"variant": name, "sets": sets, **row}
    gc.collect()  # The variant's state and executable go before the next one's.
    rows.append(row)
    if "error" in row:
      print(f"{name:<28} {'does not fit' if not row['fits'] else 'FAILED'}: {row['error']}",
            flush=True)
    else:
      print(f"{name:<28} batch {row['batch']} x {row['length']}, {row['attention']}, remat "
            f"{row['remat']}: step {row['step_ms']:.1f} ms, {row['tokens_per_s']:,.0f} "
            f"tokens/s, {row['tflops_per_device']:.1f} TFLOP/s, MFU {row['mfu']:.1%}; "
            f"XLA memory {row['xla_memory_gib'] or 0:.2f} GiB; compile {row['compile_s']:.0f} s;"
            f" loss {row['loss']:.3f}" + (f"; estimate {row['estimate_ms']:.1f} ms "
                                            f"({row['estimate_error']:+.1%})"
                                            if "estimate_ms" in row else ""), flush=True)
  datasheet, source = mfu.peak_flops_per_device(device)
  measured = mfu.measured_matmul_peak(args.matmul_size, 10, "bfloat16")
  print(f"peaks: datasheet {datasheet / 1e12:.0f} TFLOP/s ({source}); best of 10 bfloat16 "
        f"{args.matmul_size}^3 matmuls here {measured / 1e12:.1f} TFLOP/s "
        f"({measured / datasheet:.1%} of the datasheet)")
  if args.json:
    with open(args.json, "a", encoding="utf-8") as f:
      for row in rows:
        f.write(json.dumps(dict(row, jax=jax.__version__, device=device.device_kind,
                                measured_peak_tflops=measured / 1e12)) + "\n")


if __name__ == "__main__":
  main()
