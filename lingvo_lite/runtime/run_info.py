"""Who ran a job, with what: one JSON row per train start in `JOB/run_info.jsonl`.

A job dir outlives the machine and the checkout that trained it; the report
(`--mode=report`) shows these rows as the run's identity: the experiment, the command line,
the versions of the stack, the git commit of the code, the host, the devices and the mesh.
Each start or resume adds a row, so a run resumed on another machine or after an upgrade says
so. The train program writes the row once its starting state is in hand and takes it back if
the run fails before saving a checkpoint, as it does its metric rows.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
from typing import Any, Sequence

from etils import epath

import lingvo_lite
from lingvo_lite import file_writes, input_files, paths

FILE_NAME = "run_info.jsonl"
# The distributions whose versions decide what a run computes, as pip names them.
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "fiddle", "orbax-checkpoint", "numpy",
             "tensorflow", "seqio", "tensorstore")
_CODE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(lingvo_lite.__file__)))


def package_versions(*packages: str) -> dict[str, str | None]:
  """The installed version of each package (None: not installed)."""
  found = {}
  for package in packages:
    try:
      found[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      found[package] = None
  return found


def _git(*args: str) -> str | None:
  """`git -C <this checkout> ARGS`'s output, or None where there is no git or no repository
  (an installed wheel, Bazel's runfiles)."""
  try:
    done = subprocess.run(["git", "-C", _CODE_ROOT, *args], capture_output=True, text=True,
                          timeout=10, check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  return done.stdout.strip() if done.returncode == 0 else None


def collect(start_step: int, devices: list[Any], mesh_shape: dict[str, int],
            process_count: int, experiment: str | None,
            argv: Sequence[str] | None = None,
            initialized_from: str | None = None) -> dict[str, Any]:
  """The row of this start: time, command, versions, code, host, devices, mesh, and the
  weights a new job started from.

  `argv` is the command line as the executor parsed it (the program's Invocation carries it:
  in-process runs have no sys.argv of their own); None records this process's sys.argv.
  `initialized_from`: what a warm start loaded (`JOB@STEP sha256:...`, train.init_from);
  None for a fresh initialization or a resume.
  """
  commit = _git("rev-parse", "HEAD")
  status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
  first = devices[0]
  return {
      "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "start_step": int(start_step),
      "experiment": experiment,
      "argv": list(argv if argv is not None else sys.argv),
      "versions": {"python": platform.python_version(),
                   **package_versions("lingvo_lite", *_PACKAGES)},
      "git_commit": commit,
      "git_dirty": bool(status) if status is not None else None,
      "host": socket.gethostname(),
      "process_count": int(process_count),
      "platform": str(first.platform),
      "device_kind": str(first.device_kind),
      "device_count": len(devices),
      "mesh": {str(axis): int(size) for axis, size in mesh_shape.items()},
      "initialized_from": initialized_from,
  }


class RunInfoWriter:
  """Appends a row to `JOB/run_info.jsonl`, and takes it back on `rollback`."""

  def __init__(self, job_dir: epath.Path, enabled: bool = True):
    self._path = job_dir / FILE_NAME
    self._enabled = enabled
    self._appended = False
    self._original: bytes | None = None  # The file before `append` (None: there was none).

  def append(self, row: dict[str, Any]) -> None:
    if not self._enabled:
      return
    self._original = self._path.read_bytes() if self._path.exists() else None
    old = self._original or b""
    if old and not old.endswith(b"\n"):  # A killed run's half row stays a line of its own.
      old += b"\n"
    with file_writes.writing(self._path):
      paths.write_atomically(self._path,
                             old + (json.dumps(row, sort_keys=True) + "\n").encode())
    self._appended = True

  def commit(self) -> None:
    self._appended = False

  def rollback(self) -> None:
    """Puts the file back as it was before `append`, byte for byte (or not there), by cutting
    the row off: no free space needed (a full disk is a reason to roll back)."""
    if not self._appended:
      return
    self._appended = False
    if self._original is None:
      self._path.unlink(missing_ok=True)
    elif self._path.exists():
      file_writes.truncate(self._path, len(self._original))


def read(job_dir: epath.Path) -> list[dict[str, Any]]:
  """The rows of `JOB/run_info.jsonl`, oldest first; a half-written last line is skipped."""
  path = job_dir / FILE_NAME
  try:
    text = path.read_text()
  except (FileNotFoundError, NotADirectoryError):
    return []
  rows = []
  for line in text.splitlines():
    try:
      row = input_files.json_value(line)
    except ValueError:
      continue
    if isinstance(row, dict):
      rows.append(row)
  return rows
