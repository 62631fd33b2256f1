"""Wall time and peak host memory of the compile program, and of --mode=print, per experiment.

  python bench/compile_bench.py [--repeats 3] [--cases gptj,small] [--print_experiments]

Each case runs `python -m lingvo_lite --mode=compile ...` as its own process, the way a user
runs it (process start to exit, imports included), and reads the child's peak RSS from
`os.wait4`. Cases: GPT-J-6B for v5e-256 and the 4-layer BenchSmall shapes for v5e-8 (MaxText's
train_compile.py took 75.7 s / 2.09 GB for llama2-7b on v5e-256 and 18.6 s / 1.24 GB for those
small shapes on v5e-8, measured on this kind of machine). With --print_experiments it also
times `--mode=print` of every registered experiment. Prints one line per run and the median per
case last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {
    "gptj": ["--exp=GptJ6B", "--mode=compile", "--compile_topology=v5e-256"],
    "small": ["--exp=BenchSmall", "--mode=compile", "--compile_topology=v5e-8"],
}


def _timed(args: list[str]) -> tuple[float, float, int]:
  """(wall seconds, peak RSS GiB, exit code) of `python -m lingvo_lite ARGS`."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  started = time.perf_counter()
  child = subprocess.Popen([sys.executable, "-m", "lingvo_lite", *args], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  _, status, usage = os.wait4(child.pid, 0)
  wall = time.perf_counter() - started
  child.returncode = os.waitstatus_to_exitcode(status)
  return wall, usage.ru_maxrss / 2**20, child.returncode


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--print_experiments", action="store_true")
  args = parser.parse_args()
  results: dict[str, list[tuple[float, float]]] = {}
  for _ in range(args.repeats):
    for case in args.cases.split(","):
      wall, rss, code = _timed(CASES[case])
      print(f"{case}: {wall:.1f} s wall, {rss:.2f} GiB peak RSS, exit {code}", flush=True)
      results.setdefault(case, []).append((wall, rss))
  if args.print_experiments:
    listing = subprocess.run([sys.executable, "-m", "lingvo_lite", "--mode=list"], cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                             text=True, check=True).stdout
    for name in [line.split()[0] for line in listing.splitlines() if line.strip()]:
      wall, rss, code = _timed([f"--exp={name}", "--mode=print"])
      print(f"print {name}: {wall:.2f} s wall, {rss:.2f} GiB peak RSS, exit {code}", flush=True)
      results.setdefault("print (slowest experiment)", []).append((wall, rss))
  for case, runs in results.items():
    walls, rss = zip(*runs)
    summary = max if case.startswith("print") else statistics.median
    print(f"{'max' if summary is max else 'median'} {case}: {summary(walls):.1f} s wall, "
          f"{summary(rss):.2f} GiB peak RSS ({len(runs)} runs)")


if __name__ == "__main__":
  main()
