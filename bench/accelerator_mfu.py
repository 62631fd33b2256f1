"""MFU of lingvo_lite's train step on an accelerator, against its datasheet and a measured peak.

  python bench/accelerator_mfu.py [--experiment Llama1B] [--steps 10]
                                  [--set "model.attention_implementation='cudnn'" ...]

Builds the experiment (synthetic data: nothing but jax, flax, optax, orbax and fiddle is
imported), runs `--steps` timed train steps after two warm-up steps and prints step time,
tokens/s, model TFLOP/s per device (mfu.py's formula) and MFU against (a) the device's
datasheet bf16 peak and (b) the best of 10 bfloat16 8192^3 matmuls measured here. On a CPU
it runs too, with small `--set` overrides and a small `--matmul_size` (an 8192^3 bfloat16
matmul takes many seconds there); the datasheet column is then the measured float32 peak, as
in training logs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import jax
import numpy as np

from lingvo_lite import executor, mfu
from lingvo_lite.jitted import JittedSteps
# pylint: enable=wrong-import-position


def _parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--experiment", default="Llama1B")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--matmul_size", type=int, default=8192)
  parser.add_argument("--set", action="append", default=[],
                      help="PATH=VALUE override of the experiment's config; repeatable")
  return parser.parse_args()


def main() -> None:
  args = _parse_args()
  setup = executor.build_experiment(args.experiment, args.set)
  jitted = JittedSteps(setup)
  data, model = setup.train_data, setup.model
  with jitted.activated():
    state = jitted.init_state()
    batch = jitted.global_batch(data.batch(0, jax.process_index(), jax.process_count()))
    started = time.perf_counter()
    for _ in range(2):  # Compile, then one more so allocation settles.
      state, metrics = jitted.train_step(state, batch)
    jax.block_until_ready(metrics["loss"])
    warmup = time.perf_counter() - started
    step_times = []
    for _ in range(args.steps):
      started = time.perf_counter()
      state, metrics = jitted.train_step(state, batch)
      jax.block_until_ready(metrics["loss"])
      step_times.append(time.perf_counter() - started)
  step_time = statistics.median(step_times)
  devices = jax.device_count()
  flops = mfu.model_flops_per_step(model, data.global_batch_size, data.sequence_length)
  achieved = flops / step_time / devices
  datasheet, datasheet_source = mfu.peak_flops_per_device(jax.devices()[0])
  measured = mfu.measured_matmul_peak(args.matmul_size, 10, "bfloat16")
  print(f"jax {jax.__version__}, {devices} x {jax.devices()[0].device_kind}; "
        f"{args.experiment} with {args.set or 'no overrides'}")
  print(f"{model.matmul_parameters() / 1e9:.3f}B matmul parameters, batch "
        f"{data.global_batch_size} x {data.sequence_length}, {model.dtype} compute, "
        f"attention {model.attention_implementation}; warm-up (compile) {warmup:.1f} s; "
        f"loss {float(np.asarray(metrics['loss'])):.3f}")
  print(f"step {step_time * 1e3:.1f} ms (median of {args.steps}), "
        f"{data.global_batch_size * data.sequence_length / step_time:,.0f} tokens/s, "
        f"{flops / 1e12:.1f} TFLOP/step, {achieved / 1e12:.1f} TFLOP/s per device")
  print(f"MFU {achieved / datasheet:.1%} of {datasheet / 1e12:.0f} TFLOP/s ({datasheet_source}); "
        f"{achieved / measured:.1%} of {measured / 1e12:.0f} TFLOP/s (best of 10 bfloat16 "
        f"{args.matmul_size}^3 matmuls measured here)")


if __name__ == "__main__":
  main()
