"""Peak host memory of `--mode=export`, beside the parameters' own bytes.

Exports SmolLM2-135M (its GGUF file's weights, dequantized to float32: a job dir without a
checkpoint exports the weight source its experiment starts from) as a Hugging Face folder and
as a GGUF file, each in a fresh process, and reports each process's peak RSS. Give
`--checkouts` several lingvo_lite checkouts (this one and, say, a `git worktree` of an older
commit) to compare them side by side in one run, alternating.

  python bench/export_memory.py
  python bench/export_memory.py --checkouts . /tmp/older --repeats 2
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
FORMATS = ("hf", "gguf")


def _export(checkout: pathlib.Path, export_format: str, work: pathlib.Path) -> tuple[float, float]:
  """(peak RSS in MB, seconds) of one export process run from `checkout`."""
  out = work / f"out_{export_format}"
  argv = [sys.executable, "-m", "lingvo_lite", "--exp=SmolLM2_135M", "--mode=export",
          f"--job_log_dir={work / 'job'}", f"--export_format={export_format}",
          f"--export_dir={out}"]
  env = dict(os.environ, PYTHONPATH=str(checkout))
  started = time.monotonic()
  with open(work / "stdout", "w+") as stdout, open(work / "stderr", "w+") as stderr:
    # wait4, not Popen.wait: it gives this one child's resource usage.
    process = subprocess.Popen(argv, cwd=checkout, env=env, stdout=stdout, stderr=stderr)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - started
    stdout.seek(0)
    stderr.seek(0)
    if process.returncode != 0:
      raise SystemExit(f"{' '.join(argv)}: exit {process.returncode}: "
                       f"{stderr.read().strip()[-500:]}")
    print("   ", stdout.read().strip().splitlines()[0][:160], flush=True)
  return usage.ru_maxrss / 1024, seconds  # ru_maxrss is in KiB on Linux.


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--checkouts", nargs="+", default=[str(ROOT)],
                      help="lingvo_lite checkouts to run the exports from, side by side")
  parser.add_argument("--repeats", type=int, default=1)
  args = parser.parse_args()
  checkouts = [pathlib.Path(c).resolve() for c in args.checkouts]
  results: dict[tuple[str, str], list[tuple[float, float]]] = {}
  with tempfile.TemporaryDirectory() as scratch:
    for repeat in range(args.repeats):
      for export_format in FORMATS:
        for number, checkout in enumerate(checkouts):
          work = pathlib.Path(scratch) / f"{repeat}_{export_format}_{number}"
          work.mkdir()
          print(f"{checkout} --export_format={export_format} (repeat {repeat + 1})", flush=True)
          results.setdefault((str(checkout), export_format), []).append(
              _export(checkout, export_format, work))
  print("\nparameters: 134.5M float32 = 538 MB (513 MiB)")
  print(f"{'checkout':<40} {'format':<6} {'peak RSS MB (min)':>18} {'seconds (min)':>14}")
  for (checkout, export_format), runs in results.items():
    print(f"{checkout:<40} {export_format:<6} {min(r[0] for r in runs):>18.0f} "
          f"{min(r[1] for r in runs):>14.1f}")


if __name__ == "__main__":
  main()
