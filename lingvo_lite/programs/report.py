"""The run report: one self-contained HTML page of a job, or of jobs compared.

  --mode=report --job_log_dir=JOB                  JOB/report/index.html and config.svg
  --mode=report --job_log_dir=A --compare=B[,C]    A/report/compare.html

The page of a job shows who ran it and with what (run_info.jsonl), a summary (the final train
and eval losses, progress, throughput), plots of every logged quantity against the step, the
eval tables, the checkpoints with their verification status, the compile report and decode
samples where the job has them, and the config with each field's origin, the fields that
differ from the experiment's defaults highlighted, linked to a picture of it (config.svg).
The comparison shows the config fields that differ (Fiddle's diff) and every curve of the
jobs overlaid, one colour per job.

It reads the job's files only: no config is built, no device touched and the job's lock
never taken, so a report can be made at any time, on any machine, while the run trains; run
it again for a fresh page. Each file is written through a temporary file and a rename, so a
browser (or a second report) sees the old page or the new one, never half of one. Nothing is
written outside `--job_log_dir`'s `report/` folder; a compared job is only read.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import posixpath
import time
from typing import Any

from etils import epath

from lingvo_lite import input_files, outputs, paths
from lingvo_lite.config import diffs as config_diffs, files as config_files, graph as config_graph
from lingvo_lite.errors import UsageError
from lingvo_lite.programs import Invocation, ProgramFailure
from lingvo_lite.programs.options import option
from lingvo_lite.report import (html as report_html, job_data as report_data,
                                plots as report_plots)
from lingvo_lite.runtime import job_dirs
from lingvo_lite.runtime.job_dirs import JobFiles

FOLDER = "report"
INDEX, COMPARE, GRAPH = "index.html", "compare.html", "config.svg"
# Each step's verification result with the signature of its files (report_data): a report
# made every few minutes of a large run reads each checkpoint's bytes once, not every time.
VERIFIED_CACHE = ".verified.json"


@dataclasses.dataclass(frozen=True)
class Options:
  """The flags of --mode=report."""

  compare: list[str] | None = option(
      None, "--mode=report: other job dirs (comma-separated) to compare with --job_log_dir's: "
      "their config differences (Fiddle's diff) and curves overlaid, in "
      "JOB/report/compare.html.")


# Nothing outside JOB/report/; a compared job is only read.
JOB_FILES = JobFiles(written=(
    (FOLDER, job_dirs.FOLDER), (f"{FOLDER}/{INDEX}", job_dirs.FILE),
    (f"{FOLDER}/{COMPARE}", job_dirs.FILE), (f"{FOLDER}/{GRAPH}", job_dirs.FILE),
    (f"{FOLDER}/{VERIFIED_CACHE}", job_dirs.FILE)))


def main(invocation: Invocation) -> None:
  job_dir, shown = invocation.job_dir, invocation.shown_job_dir
  _check_job(job_dir, f"--job_log_dir={shown}")
  compare = invocation.options.compare
  if compare is None:
    write_index(job_dir, shown)
  else:
    write_compare(job_dir, shown, _compared_jobs(job_dir, compare))


def _check_job(job_dir: epath.Path, flag: str) -> None:
  """A job dir the report can read: a folder with a config.json (the executor has checked
  the kinds of the job dir's members already, for --job_log_dir)."""
  if not job_dir.exists():
    raise UsageError(f"{flag}: no such folder; give the --job_log_dir of a training run")
  if not job_dir.is_dir():
    raise UsageError(f"{flag}: is a file, not a folder; give the --job_log_dir of a training "
                     "run")
  config = job_dir / config_files.CONFIG_JSON
  if not config.exists() or config.is_dir():
    raise UsageError(f"{flag}: holds no {config_files.CONFIG_JSON}, so it is not the job dir "
                     "of a training run; give the --job_log_dir a run trained in")
  if report_data.is_special_file(config):  # Reading a FIFO would wait for ever.
    raise UsageError(f"{flag}: its {config_files.CONFIG_JSON} is not a regular file (a FIFO, "
                     "socket or device); give the --job_log_dir a run trained in")


def _compared_jobs(job_dir: epath.Path, values: list[str]) -> list[tuple[epath.Path, str]]:
  """The --compare job dirs, resolved, each with its name as given."""
  if not values:
    raise UsageError("--compare=: names no job dir; give the job dirs to compare with, "
                     "comma-separated: --compare=runs/b,runs/c")
  found: list[tuple[epath.Path, str]] = []
  for index, value in enumerate(values, 1):
    if not value:  # paths.resolve would make it the working directory.
      raise UsageError(f"--compare={','.join(values)}: item {index} is empty; give each job "
                       "dir once, comma-separated, without empty items: --compare=runs/b,runs/c")
    flag = f"--compare={value}"
    path = paths.resolve(value, "--compare")
    if _same(path, job_dir):
      raise UsageError(f"{flag}: is --job_log_dir itself; give other runs' job dirs")
    if any(_same(path, other) for other, _ in found):
      raise UsageError(f"{flag}: names the same job dir twice; give each once")
    _check_job(path, flag)
    found.append((path, value.rstrip("/") or value))
  return found


def _same(path: epath.Path, other: epath.Path) -> bool:
  """Whether two job dirs are one: equal, or (local ones) the same folder through a link."""
  if path == other:
    return True
  if paths.is_remote(str(path)) or paths.is_remote(str(other)):
    return False
  return os.path.realpath(os.fspath(path)) == os.path.realpath(os.fspath(other))


def _shown(shown: str, name: str) -> str:
  """A file of the report folder, as the user wrote --job_log_dir (relative stays relative)."""
  return posixpath.join(shown, FOLDER, name)


def _total_steps(config: config_diffs.JobConfig) -> int | None:
  for field in config.fields:
    if field.path == "train.steps":
      try:
        value = ast.literal_eval(field.value)
      except (ValueError, SyntaxError):
        return None
      return value if isinstance(value, int) and value > 0 else None
  return None


def _read_cache(folder: epath.Path) -> dict[str, Any]:
  if report_data.is_special_file(folder / VERIFIED_CACHE):
    return {}  # A FIFO: reading it would block; every step is verified again.
  try:
    cached = input_files.json_value((folder / VERIFIED_CACHE).read_text())
  except (OSError, ValueError):
    return {}  # None yet, or damaged: every step is verified again.
  return cached if isinstance(cached, dict) else {}


def _graph(cfg: Any) -> tuple[str | None, str | None]:
  """(config.svg's text, None), or (None, why there is none)."""
  try:
    return config_graph.svg(cfg), None
  except UsageError as e:
    return None, str(e)


def write_index(job_dir: epath.Path, shown: str) -> None:
  """Writes JOB/report/index.html (and config.svg, which it links) and prints their paths."""
  folder = job_dir / FOLDER
  now = time.time()
  cached = _read_cache(folder)
  job = report_data.read(job_dir, shown, cached, now)
  config = config_diffs.job_config(job_dir, "--job_log_dir")
  graph, graph_note = _graph(config.cfg)
  plots = report_plots.plots([job], [config.objective])
  page = report_html.index_page(job, config, plots, _total_steps(config),
                                GRAPH if graph else None, graph_note, now)
  files = [(GRAPH, graph)] if graph else []  # Before the page that links it.
  if job.checked != cached:
    files.append((VERIFIED_CACHE, json.dumps(job.checked)))
  _write(folder, shown, files + [(INDEX, page)])
  outputs.print_summary(f"report: {_shown(shown, INDEX)}")
  if graph:
    outputs.print_summary(f"config graph: {_shown(shown, GRAPH)}")


def _report_link(page_folder: epath.Path, other: epath.Path) -> str | None:
  """A relative link from `page_folder` to `other`'s own report page, where it has one."""
  index = other / FOLDER / INDEX
  if paths.is_remote(str(index)) or not index.exists():
    return None
  return os.path.relpath(os.fspath(index), os.fspath(page_folder))


def write_compare(job_dir: epath.Path, shown: str,
                  others: list[tuple[epath.Path, str]]) -> None:
  """Writes A/report/compare.html of A and `others` and prints its path."""
  folder = job_dir / FOLDER
  now = time.time()
  listed = [(job_dir, shown, "--job_log_dir")] + [(p, s, "--compare") for p, s in others]
  # Checkpoints are not shown here, so none is read (and no other job's cache is written).
  jobs = [report_data.read(path, name, now=now, with_checkpoints=False)
          for path, name, _ in listed]
  configs = [config_diffs.job_config(path, flag) for path, _, flag in listed]
  differences = config_diffs.differences([config.cfg for config in configs])
  links = [_report_link(folder, path) for path, _, _ in listed]
  plots = report_plots.plots(jobs, [config.objective for config in configs])
  page = report_html.compare_page(jobs, configs, differences, plots, links, now)
  _write(folder, shown, [(COMPARE, page)])
  outputs.print_summary(f"comparison: {_shown(shown, COMPARE)}")


def _write(folder: epath.Path, shown: str, files: list[tuple[str, str]]) -> None:
  """Writes each (name, text) whole; a failure is one line naming its cause (a full disk, a
  read-only file system), and takes back the files of a report folder this run created."""
  written = []
  try:
    with outputs.created_folders(folder) as new:
      try:
        for name, text in files:
          paths.write_atomically(folder / name, text)
          written.append(name)
      except OSError:
        for name in written if new else ():
          (folder / name).unlink(missing_ok=True)
        raise
  except OSError as e:
    raise ProgramFailure(outputs.failed_write(f"the report to {posixpath.join(shown, FOLDER)}",
                                              e, "make the report again")) from None
