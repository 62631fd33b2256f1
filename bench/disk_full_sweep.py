"""A full disk at many moments of a training run: nothing verified is lost, nothing temporary
stays, and the same command resumes to the uninterrupted run's result.

  python bench/disk_full_sweep.py [--code ROOT] [--dir DIR] [--only NAME,...]

The run is tiny (`PyCodeTiny --fiddler=tiny --fiddler=synthetic_data`, 12 steps, a checkpoint
every 3 steps, `max_to_keep=2`, an evaluation every 6 steps and at the end), in a job dir on a
small tmpfs (lingvo_lite.runtime.small_disk: root mounts it; elsewhere a user namespace). Each fill
point makes the disk full at one moment, in one of three ways:
  size N      the tmpfs holds N KiB: the first write past it fails (the config at the start,
              a metric row, the first, second or third checkpoint, its checksums, a commit)
  after X     a watcher in this process fills the disk the moment X appears in the job (a
              checkpoint's temporary folder, a verified step, a metric row, an eval row)
  rerun K     the job finished on a big disk, then filled but for K pages, and the same
              command run again (it resumes at the end: its evaluation and its commit, where
              the config is rewritten; K=0 fails earlier, at its run-info row)
  resume K    the job finished on a big disk, its last checkpoint then deleted (as a kill
              between logging step 12 and committing its checkpoint leaves a job: rows past
              the verified step 9), the disk filled but for K pages, and the same command
              run again: it resumes from step 9 and its first save fails
Then the filler goes, the disk grows to 64 MiB, and the same command runs again.

One row per fill point:
  exit        the failed run's exit code (1 expected)
  one line    its `lingvo_lite: error:` line, shortened (and `TRACEBACK` if there was one)
  kept        the metric and eval rows on disk after the failure are exactly the
              uninterrupted run's rows up to the newest verified checkpoint
  resumed     the rerun exited 0 and said where it resumed from
  metrics     metrics.jsonl and eval_validation.jsonl equal the uninterrupted run's, row for
              row, wall-clock fields aside
  params      the final checkpoint's arrays are bitwise the uninterrupted run's
  temps       temporary files and folders left in the job after the failure (and after the
              rerun): a rewrite's, the checksums', orbax's, a delete's, a step set aside

`--code ROOT` runs another checkout's lingvo_lite (e.g. an older commit's, unpacked with
`git archive`), to show what this sweep finds there. Each fill point costs two or three runs
of a few seconds; the sweep takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)

# pylint: disable=wrong-import-position
import numpy as np

from lingvo_lite.runtime import small_disk
# pylint: enable=wrong-import-position

ARGS = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
        "--fdl.train.log_every_steps=1", "--fdl.optimizer.decay_steps=1000",
        "--fdl.train.steps=12", "--fdl.checkpoint.every_steps=3",
        "--fdl.checkpoint.max_to_keep=2", "--fdl.train.eval_every_steps=6"]
STEPS = 12
EVAL_FILE = "eval_validation.jsonl"
# The wall-clock fields of the rows: the rest is a function of the step alone.
WALL_CLOCK = {"step_time_s", "steps_per_s", "tokens_per_s", "tflops_per_device", "mfu",
              "data_wait_s", "eta_s", "compile_s", "checkpoint_s", "eval_s", "seconds"}
BIG = "64m"


def _temporaries(job: str) -> list[str]:
  if not os.path.isdir(job):
    return []
  return sorted(os.path.relpath(os.path.join(folder, name), job)
                for folder, folders, files in os.walk(job) for name in folders + files
                if ".tmp" in name or "-tmp" in name or "-deleting" in name
                or ".unverified" in name)


def _rows(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        row = json.loads(line)
      except ValueError:
        row = {"unreadable": line[:40]}
      rows.append({k: v for k, v in row.items() if k not in WALL_CLOCK})
  return rows


def _curves(job: str) -> dict[str, list[dict]]:
  return {name: _rows(os.path.join(job, name)) for name in ("metrics.jsonl", EVAL_FILE)}


def _verified_steps(job: str) -> list[int]:
  folder = os.path.join(job, "checkpoints")
  if not os.path.isdir(folder):
    return []
  return sorted(int(name) for name in os.listdir(folder) if name.isdigit() and os.path.exists(
      os.path.join(folder, name, "lingvo_lite_checksums.json")))


def _leaves(step_dir: str) -> dict[str, np.ndarray]:
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  tree = ocp.StandardCheckpointer().restore(os.path.join(os.path.abspath(step_dir), "default"))
  return {jax.tree_util.keystr(path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


class _Runner:
  """Runs `python -m lingvo_lite ARGS --job_log_dir=disk/job` in `cwd`, where `disk` is."""

  def __init__(self, code: str, cwd: str, cache: str):
    self.code, self.cwd, self.cache = code, cwd, cache
    self.disk: small_disk.SmallDisk | None = None

  def run(self, job: str = "disk/job") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=self.code)
    env.pop("XLA_FLAGS", None)
    argv = [sys.executable, "-m", "lingvo_lite", *ARGS, f"--job_log_dir={job}",
            f"--compilation_cache_dir={self.cache}"]
    if self.disk is not None and job.startswith("disk/"):
      argv = self.disk.command(argv)
    return subprocess.run(argv, cwd=self.cwd, env=env, capture_output=True, text=True,
                          timeout=600, check=False, stdin=subprocess.DEVNULL)


class _Watcher:
  """Fills the disk the moment `condition()` holds (polled every millisecond)."""

  def __init__(self, disk: small_disk.SmallDisk, condition: Callable[[], bool]):
    self.fired = False
    self._stop = threading.Event()

    def watch():
      while not self._stop.is_set():
        try:
          hit = condition()
        except OSError:
          hit = False
        if hit:
          disk.fill()
          self.fired = True
          return
        time.sleep(0.001)
    self._thread = threading.Thread(target=watch, daemon=True)
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()
    self._thread.join()


def _exists(disk, *parts: str) -> Callable[[], bool]:
  return lambda: os.path.exists(os.path.join(disk.path, "job", *parts))


def _tmp_of(disk, step: int) -> Callable[[], bool]:
  folder = os.path.join(disk.path, "job", "checkpoints")
  return lambda: any(name.startswith(f"{step}.orbax-checkpoint-tmp")
                     for name in os.listdir(folder)) if os.path.isdir(folder) else False


def _row_logged(disk, name: str, step: int) -> Callable[[], bool]:
  path = os.path.join(disk.path, "job", name)

  def logged():
    with open(path) as f:
      return any(f'"step": {step},' in line for line in f)
  return lambda: os.path.exists(path) and logged()


# name -> (size of the tmpfs, what to do before the failing run: returns a watcher or None).
def _points() -> list[tuple[str, str, Callable]]:
  none = lambda runner, disk: None
  points = [(f"size {kib}k", f"{kib}k", none)
            for kib in (40, 52, 60, 64, 800, 1700, 2200, 3300)]

  def after(condition_of):
    return lambda runner, disk: _Watcher(disk, condition_of(disk))

  points += [
      ("after first row", BIG, after(lambda d: _row_logged(d, "metrics.jsonl", 1))),
      ("after step 3's save starts", BIG, after(lambda d: _tmp_of(d, 3))),
      ("after step 3 is saved", BIG,
       after(lambda d: _exists(d, "checkpoints", "3", "_CHECKPOINT_METADATA"))),
      ("after step 3 is verified", BIG,
       after(lambda d: _exists(d, "checkpoints", "3", "lingvo_lite_checksums.json"))),
      ("after row 5", BIG, after(lambda d: _row_logged(d, "metrics.jsonl", 5))),
      ("after the eval row of step 6", BIG, after(lambda d: _row_logged(d, EVAL_FILE, 6))),
      ("after step 9 is verified", BIG,
       after(lambda d: _exists(d, "checkpoints", "9", "lingvo_lite_checksums.json"))),
      ("after step 12's save starts", BIG, after(lambda d: _tmp_of(d, 12))),
  ]

  def rerun(free_pages):
    def prepare(runner, disk):
      finished = runner.run()
      if finished.returncode != 0:
        raise RuntimeError(f"the run to rerun failed: {finished.stderr[-2000:]}")
      if free_pages is not None:
        disk.fill(free_pages)
    return prepare
  points += [(f"rerun {k}", BIG, rerun(k)) for k in (0, 4, 12)]

  def resume(free_pages):
    def prepare(runner, disk):
      rerun(None)(runner, disk)
      shutil.rmtree(os.path.join(disk.path, "job", "checkpoints", str(STEPS)))
      disk.fill(free_pages)
    return prepare
  points.append(("resume 64", BIG, resume(64)))
  return points


def _error_line(stderr: str) -> str:
  lines = [line for line in stderr.splitlines() if line.startswith("lingvo_lite: error:")]
  text = " | ".join(line[len("lingvo_lite: error: "):] for line in lines) or "-"
  text = re.sub(r"/\S*/disk/job/", "JOB/", text)
  text = re.sub(r"RESOURCE_EXHAUSTED: .*?(;|$)", r"...\1", text)
  text = re.split(r"; (training stopped|free space)", text)[0]
  if "Traceback" in stderr:
    text = "TRACEBACK " + text
  return text[:110]


def _sweep_point(name: str, size: str, prepare: Callable, runner: _Runner, parent: str,
                 reference: dict) -> dict:
  cwd = os.path.join(parent, re.sub(r"\W+", "_", name))
  os.makedirs(cwd)
  runner.cwd = cwd
  with small_disk.SmallDisk(os.path.join(cwd, "disk"), size) as disk:
    runner.disk = disk
    job = os.path.join(disk.path, "job")
    watcher = prepare(runner, disk)
    failed = runner.run()
    if watcher is not None:
      watcher.stop()
    for stream in ("stdout", "stderr"):  # Kept with --dir, for a look at a bad row.
      with open(os.path.join(cwd, f"failed.{stream}"), "w") as f:
        f.write(getattr(failed, stream))
    verified = _verified_steps(job)
    newest = verified[-1] if verified else 0
    curves = _curves(job)
    kept = all(curves[file] == [r for r in reference["curves"][file] if r["step"] <= newest]
               for file in curves)
    temps_after_failure = _temporaries(job)
    disk.unfill()
    disk.resize(BIG)
    resumed = runner.run()
    said = re.search(r"resumed from step (\d+)|initialized a new state", resumed.stdout)
    curves = _curves(job)
    steps = _verified_steps(job)
    params = False
    if steps and steps[-1] == STEPS:
      leaves = _leaves(os.path.join(job, "checkpoints", str(STEPS)))
      got = [leaves[k] for k in sorted(leaves)]
      params = len(got) == len(reference["leaves"]) and all(
          np.array_equal(a, b) for a, b in zip(got, reference["leaves"]))
    return {
        "fill point": name + ("" if watcher is None or watcher.fired else " (not reached)"),
        "exit": str(failed.returncode),
        "one line": _error_line(failed.stderr),
        "kept": "yes" if kept else "NO",
        "resumed": (said.group(0).replace("resumed from step", "from") if said and
                    resumed.returncode == 0 else f"NO (exit {resumed.returncode})"),
        "metrics": "equal" if curves == reference["curves"] else "DIFFER",
        "params": "equal" if params else "DIFFER",
        "temps": ", ".join(temps_after_failure + _temporaries(job)) or "none",
    }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--code", default=_REPO, help="the checkout whose lingvo_lite runs")
  parser.add_argument("--dir", default=None, help="where the jobs go (default: a temp folder)")
  parser.add_argument("--only", default="", help="comma-separated fill point names")
  args = parser.parse_args()
  wanted = {name.strip() for name in args.only.split(",") if name.strip()}
  unknown = sorted(wanted - {name for name, _, _ in _points()})
  if unknown:  # Else nothing runs, and the table of no rows fails.
    parser.error(f"--only: no fill point named {', '.join(unknown)}; the names are: "
                 f"{', '.join(name for name, _, _ in _points())}")
  parent = args.dir or tempfile.mkdtemp(prefix="disk_full_sweep.")
  try:
    _sweep(args, parent, wanted)
  finally:
    if not args.dir:  # A temporary folder goes, whatever ended the sweep.
      shutil.rmtree(parent, ignore_errors=True)


def _sweep(args: argparse.Namespace, parent: str, wanted: set[str]) -> None:
  os.makedirs(parent, exist_ok=True)
  cache = os.path.join(parent, "jax_cache")
  runner = _Runner(os.path.abspath(args.code), parent, cache)
  started = time.time()
  uninterrupted = runner.run("reference")
  if uninterrupted.returncode != 0:
    sys.exit(f"the uninterrupted run failed:\n{uninterrupted.stderr[-3000:]}")
  reference_job = os.path.join(parent, "reference")
  reference = {"curves": _curves(reference_job),
               "leaves": [leaf for _, leaf in sorted(
                   _leaves(os.path.join(reference_job, "checkpoints", str(STEPS))).items())]}
  print(f"uninterrupted run: {len(reference['curves']['metrics.jsonl'])} metric rows, "
        f"{len(reference['curves'][EVAL_FILE])} eval rows ({time.time() - started:.0f} s); "
        f"code: {runner.code}", flush=True)
  rows = []
  columns = ("fill point", "exit", "one line", "kept", "resumed", "metrics", "params", "temps")
  for name, size, prepare in _points():
    if wanted and name not in wanted:
      continue
    try:
      row = _sweep_point(name, size, prepare, runner, parent, reference)
    except Exception as e:  # pylint: disable=broad-except
      row = dict.fromkeys(columns, "-") | {"fill point": name, "one line": f"SWEEP FAILED: {e}"}
    rows.append(row)
    print(" | ".join(row[c] for c in columns), flush=True)
  widths = [max(len(c), *(len(row[c]) for row in rows)) for c in columns]
  print(f"\n{len(rows)} fill points in {time.time() - started:.0f} s:")
  for row in [dict(zip(columns, columns))] + rows:
    print("  ".join(row[c].ljust(w) for c, w in zip(columns, widths)).rstrip())


if __name__ == "__main__":
  main()
