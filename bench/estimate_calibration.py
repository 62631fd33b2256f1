"""The compile report's step-time estimate beside the measured step, row by row of the README's
"Measured on a TPU v5e" training table, and the chip constants it divides by, measured.

  python bench/estimate_calibration.py [--rows NAME,...] [--steps 10] [--profile DIR]
      [--json FILE] [--no_constants]          # on the TPU VM (bash bench/tpu_check.sh estimate)
  python bench/estimate_calibration.py --aot [--rows NAME,...] [--json FILE]   # on a CPU host

On a TPU: for each row (bench/tpu_check.sh's `train` variants), the train step is compiled
once; that executable is timed (2 warm-up steps, then the median of --steps) and its optimized
HLO is counted by programs/compile/step_estimate.py on the chip's constants
(lingvo_lite/chips.py). A row prints the estimate, its parts, the measured step and the error.
With --profile DIR, one more traced step per row sets each kernel's measured time beside its
estimate (by instruction name, loops' trips included): the parts' measured and estimated
totals and the kernels that differ most, written to DIR/<row>.json. Then (unless
--no_constants) the constants chips.py takes are measured: the bf16 8192^3 matmul, the copy
bandwidth (read + written), the read bandwidth (a sum over 1 GiB), the per-kernel overhead (a
chain of 2,000 small dependent matmuls) and a loop trip's overhead (the same chain as a loop).

With --aot (no TPU): each row is compiled for `v5e-1` from this host through libtpu (as
`python -m lingvo_lite --exp=Llama1BOneChip --mode=compile --compile_topology=v5e-1` does),
estimated, and set beside the step the README measured on the chip (bench/results/2026-12-06/
train.txt). The target: every row within 10%.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import jax
import jax.numpy as jnp

from bench import timed_steps
from lingvo_lite import chips, executor, mfu, target as targets
from lingvo_lite.programs.compile import step_estimate
# pylint: enable=wrong-import-position

# SmolLM2-135M's shape as bench/tpu_check.sh's train stage sets it on Llama1B.
SMOLLM2 = ["model.vocab_size=49152", "model.num_layers=30", "model.dim=576",
           "model.num_heads=9", "model.num_kv_heads=3", "model.head_dim=64",
           "model.mlp_dim=1536", "model.rotary_base=100000.0", "model.tie_embeddings=True",
           "train_data.vocab_size=49152", "eval_data.vocab_size=49152",
           "train_data.sequence_length=512", "train_data.global_batch_size=8",
           "train.grad_accum_steps=1", "partitioner.ici_fsdp=1"]
# name: (experiment, overrides, the README's measured step in ms on the lent v5e, 2026-12-06).
ROWS = {
    "einsum_full_b4": ("Llama1BOneChip", ["model.attention_implementation='einsum'",
                                          "model.remat_policy='full'"], 376.3),
    "splash_full_b4": ("Llama1BOneChip", ["model.remat_policy='full'"], 335.5),
    "splash_save_attention_b4": ("Llama1BOneChip", ["model.remat_policy='save_attention'"],
                                 312.4),
    "splash_minimal_b4": ("Llama1BOneChip", ["model.remat_policy='minimal'"], 285.0),
    "splash_minimal_b4_unrolled": ("Llama1BOneChip", ["model.remat_policy='minimal'",
                                                      "model.scan_layers=False"], 291.3),
    "splash_none_b2": ("Llama1BOneChip", ["model.remat_policy='none'",
                                          "train_data.global_batch_size=2"], 162.1),
    "smollm2_135m_none_b8": ("Llama1B", [*SMOLLM2, "model.remat_policy='none'",
                                         "model.scan_layers=False"], 46.2),
}


def _args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated: " + ", ".join(ROWS))
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--aot", action="store_true",
                      help="compile for v5e-1 on this host; compare with the README's steps")
  parser.add_argument("--profile", help="also trace a step per row; per-kernel files here")
  parser.add_argument("--json", help="append the rows (and constants) as JSON lines")
  parser.add_argument("--no_constants", action="store_true")
  parser.add_argument("--chip", choices=tuple(chips.CHIPS),
                      help="count on this chip's constants (default: this host's chip)")
  return parser.parse_args()


def _parts(totals: step_estimate.Totals) -> str:
  return ", ".join(f"{part} {seconds * 1e3:.1f}" for part, seconds in totals.seconds.items()
                   if seconds)


def _row(name: str, estimate: step_estimate.Totals, measured_ms: float, how: str) -> dict:
  estimated_ms = estimate.total * 1e3
  error = estimated_ms / measured_ms - 1
  print(f"{name:<28} estimate {estimated_ms:7.1f} ms ({_parts(estimate)}); {how} "
        f"{measured_ms:7.1f} ms; error {error:+.1%}", flush=True)
  return {"row": name, "estimate_ms": estimated_ms, "measured_ms": measured_ms,
          "error": error, "how": how, "parts_ms": {k: v * 1e3 for k, v in
                                                 estimate.seconds.items()},
          "overlapped_ms": {k: v * 1e3 for k, v in estimate.hidden.items() if v},
          "matmul_tflop": estimate.flops / 1e12, "hbm_gb": estimate.hbm_bytes / 1e9,
          "kernels": estimate.kernels}


def aot_row(name: str) -> dict:
  """A row compiled for v5e-1 on this host, beside the README's measured step."""
  from lingvo_lite.programs.compile import aot  # pylint: disable=import-outside-toplevel
  experiment, sets, measured = ROWS[name]
  target = targets.compile_target("v5e-1")
  with targets.active(target):
    setup = executor.build_experiment(experiment, sets)
    result = aot.compile_step(setup, target, "train", need_executable=True)
  chip = chips.chip_of(target.device_kind)
  estimate = step_estimate.estimate(result.executable.as_text(), chip,
                                    tuple(result.jitted.mesh.devices.flat))
  return _row(name, estimate, measured, "README measured")


def chip_row(name: str, steps: int, profile: str | None, chip_name: str | None = None) -> dict:
  """A row compiled, timed and estimated on this host's chip, one executable for both."""
  from lingvo_lite.on_mesh.jitted import JittedSteps  # pylint: disable=import-outside-toplevel
  experiment, sets, readme = ROWS[name]
  setup = executor.build_experiment(experiment, sets)
  jitted = JittedSteps(setup)
  with jitted.activated():
    compiled = jitted.train_step.lower(jitted.sharded_state.abstract,
                                       jitted.abstract_batch()).compile()
    state = jitted.init_state()
    batch = jitted.global_batch(setup.train_data.batch(0, jax.process_index(),
                                                       jax.process_count()))
    times, state, _ = timed_steps.each_step_seconds(compiled, state, batch, steps)
    hlo = compiled.as_text()
    chip = (chips.CHIPS[chip_name] if chip_name
            else chips.chip_of(jax.devices()[0].device_kind))
    devices = tuple(jitted.mesh.devices.flat)
    row = _row(name, step_estimate.estimate(hlo, chip, devices),
               statistics.median(times) * 1e3, "measured")
    row["readme_ms"] = readme
    if profile:
      def step():
        nonlocal state
        state, out = compiled(state, batch)
        jax.block_until_ready(out["loss"])
      row["profile"] = _profile(name, step, step_estimate.kernel_times(hlo, chip, devices),
                                profile)
  return row


def _device_ops(folder: str) -> dict[str, float]:
  """Each HLO instruction's own device time (s) in the trace under `folder`."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import tpu_profile  # pylint: disable=import-outside-toplevel
  xplane = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)[0]
  data = jax.profiler.ProfileData.from_file(xplane)
  own: dict[str, float] = collections.Counter()
  for plane in data.planes:
    if plane.name.startswith("/device:") and "CUSTOM" not in plane.name:
      for line in plane.lines:
        if line.name == "XLA Ops":
          own.update(tpu_profile._exclusive(  # pylint: disable=protected-access
              [(e.start_ns, e.duration_ns, e.name) for e in line.events]))
  by_name: dict[str, float] = collections.Counter()
  for text, ns in own.items():
    found = re.match(r"\s*%?([\w.\-]+)", text)
    if found:
      by_name[found.group(1)] += ns / 1e9
  return by_name


def _profile(name: str, step, kernels: dict, out: str) -> dict:
  """One traced step's kernels beside their estimates: each part's totals, the largest gaps."""
  folder = tempfile.mkdtemp()
  jax.profiler.start_trace(folder)
  step()
  jax.profiler.stop_trace()
  measured = _device_ops(folder)
  parts: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
  gaps = []
  for kernel, seconds in measured.items():
    cost = kernels.get(kernel)
    part = cost.part if cost else "not estimated"
    parts[part][0] += seconds
    parts[part][1] += cost.seconds if cost else 0.0
    gaps.append((seconds - (cost.seconds if cost else 0.0), kernel, part, seconds,
                 cost.seconds if cost else 0.0))
  for kernel, cost in kernels.items():
    if kernel not in measured:
      parts[cost.part][1] += cost.seconds
      gaps.append((-cost.seconds, kernel, cost.part, 0.0, cost.seconds))
  gaps.sort(key=lambda g: -abs(g[0]))
  summary = {"parts_ms": {p: {"measured": m * 1e3, "estimated": e * 1e3}
                          for p, (m, e) in parts.items()},
             "largest_gaps": [{"kernel": k, "part": p, "measured_ms": m * 1e3,
                               "estimated_ms": e * 1e3} for _, k, p, m, e in gaps[:40]]}
  print("  by part (measured / estimated ms): " + ", ".join(
      f"{p} {v['measured']:.1f} / {v['estimated']:.1f}"
      for p, v in summary["parts_ms"].items()), flush=True)
  for gap in summary["largest_gaps"][:8]:
    print(f"    {gap['kernel']:<44} [{gap['part']}] measured {gap['measured_ms']:.3f} ms, "
          f"estimated {gap['estimated_ms']:.3f} ms", flush=True)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, f"{name}.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  return {"parts_ms": summary["parts_ms"]}


def _best(function, repeats: int = 10) -> float:
  function()
  best = float("inf")
  for _ in range(repeats):
    started = time.perf_counter()
    function()
    best = min(best, time.perf_counter() - started)
  return best


def constants() -> dict:
  """chips.py's figures for this chip, measured here (each line names what measured it)."""
  ones = jnp.ones((2**29,), jnp.bfloat16)  # 1 GiB
  copy = jax.jit(lambda a: a * 1.0001)
  read = jax.jit(lambda a: jnp.sum(a, dtype=jnp.float32))
  found = {
      "matmul_flops": mfu.measured_matmul_peak(8192, 10, "bfloat16"),
      "hbm_copy_bytes_per_s": 2 * ones.nbytes / _best(lambda: copy(ones).block_until_ready()),
      "hbm_read_bytes_per_s": ones.nbytes / _best(lambda: read(ones).block_until_ready()),
  }
  del ones
  count = 2000
  x, w = jnp.ones((8, 128), jnp.bfloat16), jnp.full((128, 128), 1 / 128, jnp.bfloat16)

  def chain(a, b):
    for _ in range(count):
      a = a @ b
    return a
  looped = jax.jit(lambda a, b: jax.lax.fori_loop(0, count, lambda _, c: c @ b, a))
  unrolled = jax.jit(chain)
  chained = _best(lambda: unrolled(x, w).block_until_ready())
  found["op_overhead_s"] = chained / count
  found["loop_trip_overhead_s"] = (_best(lambda: looped(x, w).block_until_ready())
                                   - chained) / count
  what = {"matmul_flops": "best of 10 bfloat16 8192^3 matmuls",
          "hbm_copy_bytes_per_s": "a 1 GiB elementwise copy, bytes read + written",
          "hbm_read_bytes_per_s": "a float32 sum of 1 GiB of bfloat16, bytes read",
          "op_overhead_s": f"a chain of {count} dependent 8x128 @ 128x128 matmuls, per matmul",
          "loop_trip_overhead_s": "the same chain as a fori_loop, minus the chain, per trip"}
  for key, value in found.items():
    print(f"constant {key}: {value:.4g} ({what[key]})", flush=True)
  return {"constants": found, "measured_by": what}


def main() -> None:
  args = _args()
  names = [n.strip() for n in args.rows.split(",") if n.strip()]
  unknown = [n for n in names if n not in ROWS]
  if unknown:
    sys.exit(f"--rows: unknown {unknown}; known: {', '.join(ROWS)}")
  device = jax.devices()[0]
  print(f"jax {jax.__version__}, {device.device_kind}; "
        f"{'AOT for v5e-1 from this host' if args.aot else 'on this chip'}", flush=True)
  rows = []
  for name in names:
    try:
      rows.append(aot_row(name) if args.aot else chip_row(name, args.steps, args.profile,
                                                            args.chip))
    except Exception as e:  # pylint: disable=broad-except  # A row per variant, whatever fails.
      print(f"{name:<28} FAILED: {str(e).splitlines()[0][:300] if str(e) else e!r}", flush=True)
      rows.append({"row": name, "failed": str(e)[:300]})
  errors = [abs(r["error"]) for r in rows if "error" in r]
  if errors:
    print(f"largest error {max(errors):.1%} over {len(errors)} rows; "
          f"{sum(e <= 0.10 for e in errors)} within 10%", flush=True)
  extra = [] if args.aot or args.no_constants or device.platform != "tpu" else [constants()]
  if args.json:
    with open(args.json, "a", encoding="utf-8") as f:
      for row in rows + extra:
        f.write(json.dumps(dict(row, jax=jax.__version__, device=device.device_kind)) + "\n")


if __name__ == "__main__":
  main()
