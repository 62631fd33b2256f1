"""Restore time and peak host memory of a params-only restore against a full-state restore.

  PYTHONPATH=. python bench/restore_bench.py [--sizes 10M,50M,100M] [--repeats 3]
      [--devices 1]

For each model size (PyCodeTiny widened and deepened: ~10M, ~50M, ~100M float32 parameters, so
Adam's moments are twice that), one child process writes a checkpoint of a random TrainState
through `Checkpointer.save`; then each restore runs in a fresh child process of its own,
full and params-only alternating, `--repeats` times each, as `--mode=train` and `--mode=eval`
restore: `JittedSteps.restore_state` or `JittedSteps.restore_params`. A child reports:
- verify: `Checkpointer.metadata` (the checksums of every file of the step, then the
  metadata), the same work for both kinds;
- restore: the `restore_*` call after that, to arrays ready in their shardings;
- peak: the child's VmHWM, its high-water RSS (not ru_maxrss, which Linux carries over from
  the parent that started the child); growth: peak minus the RSS before the restore.
The table gives the medians and the params-only / full ratios, measured side by side in one
run. The checkpoint was just written, so its files are in the page cache: the times are
those of a warm read, not of a cold disk.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# The parent process never imports jax (each child imports what it needs), so nothing the
# parent holds can leak into the children's numbers.
# pylint: disable=g-import-not-at-top

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Sizes by their rough parameter count; the table prints the exact one.
SIZES = {
    "10M": ("model.dim=512", "model.num_layers=4"),
    "50M": ("model.dim=1024", "model.num_layers=4"),
    "100M": ("model.dim=1024", "model.num_layers=8"),
}
KINDS = ("full", "params")


def _status_kb(field: str) -> int:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith(f"{field}:"))


def _jitted(sets: list[str]):
  from lingvo_lite.on_mesh.jitted import JittedSteps
  from lingvo_lite.testing import synthetic_tiny_setup
  return JittedSteps(synthetic_tiny_setup("PyCodeTiny", *sets))


def _write(directory: str, sets: list[str]) -> dict[str, int]:
  """Saves a TrainState of random values (incompressible, unlike init's zero moments)."""
  import jax
  import numpy as np
  from etils import epath
  from lingvo_lite.checkpoints.manager import Checkpointer, CheckpointSettings
  jitted = _jitted(sets)
  rng = np.random.default_rng(0)

  def random(leaf):
    value = (rng.standard_normal(leaf.shape, dtype=np.float32) if leaf.dtype == np.float32
             else rng.integers(0, 100, leaf.shape)).astype(leaf.dtype)
    return jax.device_put(value, leaf.sharding)
  abstract = jitted.sharded_state.abstract
  checkpointer = Checkpointer(epath.Path(directory), CheckpointSettings(every_steps=1))
  state = jax.tree.map(random, abstract)
  # Its step counter is the step it is saved as: a restore checks that they agree.
  state = state.replace(step=jax.device_put(np.asarray(1, state.step.dtype), state.step.sharding))
  checkpointer.save(1, state, force=True, metadata=jitted.checkpoint_metadata)
  checkpointer.close()

  def nbytes(tree):
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))
  return {"params": sum(leaf.size for leaf in jax.tree.leaves(abstract.params)),
          "params_bytes": nbytes(abstract.params), "opt_state_bytes": nbytes(abstract.opt_state)}


def _restore(directory: str, kind: str, sets: list[str]) -> dict[str, float]:
  import jax
  from etils import epath
  from lingvo_lite.checkpoints.manager import Checkpointer
  jitted = _jitted(sets)
  checkpointer = Checkpointer(epath.Path(directory), jitted.setup.checkpoint, create=False)
  step = checkpointer.latest_step()
  before_kb = _status_kb("VmRSS")
  with jitted.activated():
    started = time.perf_counter()
    checkpointer.metadata(step)  # Verifies the checksums; the restore then skips that.
    verified = time.perf_counter()
    restore = jitted.restore_params if kind == "params" else jitted.restore_state
    jax.block_until_ready(restore(checkpointer, step))
    done = time.perf_counter()
  peak_kb = _status_kb("VmHWM")
  return {"verify_s": verified - started, "restore_s": done - verified,
          "peak_mb": peak_kb * 1024 / 1e6, "growth_mb": (peak_kb - before_kb) * 1024 / 1e6}


def _child(args: list[str], devices: int) -> dict:
  paths = [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
  if devices > 1:
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  done = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env, cwd=ROOT,
                        capture_output=True, text=True, check=False)
  if done.returncode:
    raise SystemExit(f"child {' '.join(args)} failed:\n{done.stderr[-4000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def _median(runs: list[dict], key: str) -> float:
  return statistics.median(run[key] for run in runs)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default=",".join(SIZES), help=f"of {', '.join(SIZES)}")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--devices", type=int, default=1,
                      help="forced CPU devices per child, the parameters sharded over fsdp")
  parser.add_argument("--worker", choices=("write", *KINDS), help=argparse.SUPPRESS)
  parser.add_argument("--directory", help=argparse.SUPPRESS)
  parser.add_argument("sets", nargs="*", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    work = _write if args.worker == "write" else (
        lambda directory, sets: _restore(directory, args.worker, sets))
    print(json.dumps(work(args.directory, args.sets)))
    return

  rows = []
  for size in args.sizes.split(","):
    sets = [*SIZES[size]]
    if args.devices > 1:
      sets += ["partitioner.ici_data=1", f"partitioner.ici_fsdp={args.devices}"]
    with tempfile.TemporaryDirectory() as directory:
      shapes = _child(["--worker=write", f"--directory={directory}", *sets], args.devices)
      runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
      for repeat in range(args.repeats):
        # Alternating which kind goes first, so neither always meets a warmer cache.
        for kind in KINDS if repeat % 2 == 0 else KINDS[::-1]:
          run = _child([f"--worker={kind}", f"--directory={directory}", *sets], args.devices)
          runs[kind].append(run)
          print(f"{size} {kind}: verify {run['verify_s']:.2f} s, restore "
                f"{run['restore_s']:.2f} s, peak {run['peak_mb']:.0f} MB "
                f"(+{run['growth_mb']:.0f} MB)", file=sys.stderr, flush=True)
    rows.append((size, shapes, runs))

  print(f"\nParams-only vs full-state restore: medians of {args.repeats} fresh processes "
        f"each, {args.devices} CPU device(s), {os.cpu_count()} cores; state = params + "
        "Adam's moments (float32), MB = 10^6 bytes. Times exclude the checksum pass (verify), "
        "the same for both.\n")
  print("| model | params | params MB | moments MB | verify s | restore s full | "
        "restore s params | time ratio | peak MB full | peak MB params | peak ratio | "
        "growth MB full | growth MB params | growth ratio |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for size, shapes, runs in rows:
    full, params = runs["full"], runs["params"]
    cells = [size, f"{shapes['params'] / 1e6:.1f}M", f"{shapes['params_bytes'] / 1e6:.0f}",
             f"{shapes['opt_state_bytes'] / 1e6:.0f}",
             f"{_median(full + params, 'verify_s'):.2f}"]
    for key, digits in (("restore_s", 2), ("peak_mb", 0), ("growth_mb", 0)):
      a, b = _median(full, key), _median(params, key)
      cells += [f"{a:.{digits}f}", f"{b:.{digits}f}", f"{b / a:.2f}"]
    print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
  main()
