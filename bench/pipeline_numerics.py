"""Pipeline numerics, the whole matrix: every family x mesh x schedule of tests/pipeline_worker.py
(Llama and Mixtral; stage=4 x data=2 and stage=2 x fsdp=2 x tensor=2; GPipe and circular with 2
repeats) against one device over 3 steps, where the suite runs a covering set of 4.

  python bench/pipeline_numerics.py [--json OUT.json]

Prints each case's largest relative distance of the loss and of the gradients (float32; the
suite's bound is 1e-5) and the worker's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", help="write the worker's result here too")
  args = parser.parse_args()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
  started = time.perf_counter()
  completed = subprocess.run([sys.executable, "-m", "tests.pipeline_worker", "--all"], env=env,
                             cwd=ROOT, capture_output=True, text=True, check=False)
  seconds = time.perf_counter() - started
  if completed.returncode != 0:
    print(completed.stderr[-3000:], file=sys.stderr)
    return 1
  result = json.loads(completed.stdout)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)
  cases = {name: case for name, case in result.items() if name.count("/") == 2}
  return print_distances(cases, f"worker {seconds:.0f} s")


def print_distances(cases: dict[str, dict[str, float]], timing: str, width: int = 45) -> int:
  """Prints each case's largest relative distance of the loss and of the gradients and the
  largest of all; the exit status: 1 above the suite's bound (1e-5)."""
  worst = 0.0
  print(f"{'case':<{width}} {'loss':>10} {'gradients':>10}")
  for name, case in cases.items():
    worst = max(worst, case["loss"], case["grads"])
    print(f"{name:<{width}} {case['loss']:>10.2e} {case['grads']:>10.2e}")
  print(f"largest: {worst:.2e} (bound 1e-5); {timing}")
  return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
  sys.exit(main())
