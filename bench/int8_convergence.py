"""int8 training against float32, side by side: the same experiment, seed and data order.

  python bench/int8_convergence.py [--experiment PyCodeSpTiny] [--name NAME] [--steps N]
                                   [--set PATH=VALUE ...] [--out runs/int8_convergence]

Trains the experiment twice through the command line users run, `model.quantization=None`
then `"int8"` (models/quantization.py), each in its own job dir under OUT/NAME/ (an existing
one resumes: a finished run only evaluates again), then writes the run report of the int8 job
with the float one overlaid (`--mode=report --compare`: OUT/NAME/int8/report/compare.html)
and prints both runs' final train loss, final validation loss and bits per byte, the relative
difference of the bits per byte (the acceptance bound is 2%), and each run's mean step time
from its metrics (XLA:CPU has no fast int8 dot: int8 is slower on CPU, and this says by how
much). `--set` overrides apply to both runs: `--set model.dim=256` trains a larger model.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUNS = (("float", "None"), ("int8", '"int8"'))


def _parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--experiment", default="PyCodeSpTiny")
  parser.add_argument("--name", default=None, help="the runs' folder under --out "
                      "(default: the experiment's name)")
  parser.add_argument("--steps", type=int, default=None, help="train.steps (default: the "
                      "experiment's)")
  parser.add_argument("--set", action="append", default=[],
                      help="PATH=VALUE override of the config, for both runs (repeatable)")
  parser.add_argument("--out", default="runs/int8_convergence")
  return parser.parse_args()


def _last(path: pathlib.Path, key: str) -> float | None:
  """`key` of the last row of a JSON-lines file that has it."""
  value = None
  if path.exists():
    for line in path.read_text().splitlines():
      row = json.loads(line)
      if key in row:
        value = row[key]
  return value


def _mean_step_seconds(job: pathlib.Path) -> float | None:
  """The mean of the logged step times of the rows without a compile."""
  rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
  times = [row["step_time_s"] for row in rows
           if "step_time_s" in row and not row.get("compile_s")]
  return sum(times) / len(times) if times else None


def main() -> None:
  args = _parse_args()
  folder = pathlib.Path(args.out) / (args.name or args.experiment)
  results = {}
  for label, setting in RUNS:
    job = folder / label
    command = [sys.executable, "-m", "lingvo_lite", f"--exp={args.experiment}",
               f"--job_log_dir={job}", f"--fdl.model.quantization={setting}"]
    command += [f"--fdl.train.steps={args.steps}"] if args.steps else []
    command += [f"--fdl.{item}" for item in args.set]
    print("$", " ".join(command[1:]), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=os.getcwd(),
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    results[label] = {
        "wall_s": time.perf_counter() - started,
        "train_loss": _last(job / "metrics.jsonl", "loss"),
        "eval_loss": _last(job / "eval_validation.jsonl", "loss"),
        "bits_per_byte": _last(job / "eval_validation.jsonl", "bits_per_byte"),
        "step_s": _mean_step_seconds(job),
    }
  subprocess.run([sys.executable, "-m", "lingvo_lite", "--mode=report",
                  f"--job_log_dir={folder / 'int8'}", f"--compare={folder / 'float'}"],
                 check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
  print(f"\n{args.experiment} {' '.join(args.set)} ({folder})")
  print(f"{'run':<6} {'train loss':>10} {'eval loss':>10} {'bits/byte':>10} {'step s':>8} "
        f"{'wall s':>8}")
  for label, row in results.items():
    print(f"{label:<6} {row['train_loss']:>10.4f} {row['eval_loss']:>10.4f} "
          f"{row['bits_per_byte']:>10.4f} {row['step_s'] or float('nan'):>8.4f} "
          f"{row['wall_s']:>8.1f}")
  float_bpb, int8_bpb = results["float"]["bits_per_byte"], results["int8"]["bits_per_byte"]
  relative = (int8_bpb - float_bpb) / float_bpb
  print(f"bits/byte int8 vs float: {relative:+.2%} (bound: within 2%): "
        f"{'PASS' if abs(relative) <= 0.02 else 'FAIL'}")
  if results["float"]["step_s"] and results["int8"]["step_s"]:
    print(f"step time int8 / float on this host: "
          f"{results['int8']['step_s'] / results['float']['step_s']:.2f}x")
  print(f"loss curves overlaid: {folder / 'int8' / 'report' / 'compare.html'}")


if __name__ == "__main__":
  main()
