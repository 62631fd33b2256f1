"""What a job directory must look like before a program reads or writes it.

A training run creates its job dir and writes `config.*`, `checkpoints/` and metrics there;
other modes read it. A path that cannot be one (a regular file, a folder under a file, a
`checkpoints` that is a file) would otherwise fail late: after compiling, inside orbax's
background save thread, or after minutes of orbax time-outs. These checks run first, so the
user gets one line before any device time, and nothing on disk changes.
"""

from __future__ import annotations

import os

from etils import epath

from lingvo_lite import paths
from lingvo_lite.errors import UsageError

# Modes that write a job dir (and create it if missing); the others only read one.
WRITING_MODES = ("train",)
_MEMBERS_THAT_ARE_FOLDERS = ("checkpoints", "summaries")
_MEMBERS_THAT_ARE_FILES = ("config.json", "config.txt", "metrics.jsonl", "eval_metrics.jsonl")


def check(job_dir: epath.Path, mode: str, as_written: str) -> None:
  """Raises UsageError when `job_dir` cannot serve as the job dir of `mode`.

  Args:
    job_dir: The resolved path.
    mode: The program about to run.
    as_written: The flag's value as the user gave it, for the message.
  """
  flag = f"--job_log_dir={as_written}"
  if job_dir.exists() and not job_dir.is_dir():
    raise UsageError(f"{flag}: is a file, not a folder; give the job's folder (training "
                     "creates it if missing)")
  if not job_dir.exists():
    if mode not in WRITING_MODES:
      raise UsageError(f"{flag}: no such folder; give the --job_log_dir of a training run")
    _check_creatable(job_dir, flag)
    return
  for name in _MEMBERS_THAT_ARE_FOLDERS:
    member = job_dir / name
    if member.exists() and not member.is_dir():
      raise UsageError(f"{flag}: {member} is a file, not a folder; move it away, or use "
                       "another --job_log_dir")
  for name in _MEMBERS_THAT_ARE_FILES:
    member = job_dir / name
    if member.is_dir():
      raise UsageError(f"{flag}: {member} is a folder, not a file; move it away, or use "
                       "another --job_log_dir")
  if mode in WRITING_MODES and not paths.is_remote(str(job_dir)) and not os.access(
      job_dir, os.W_OK | os.X_OK):
    raise UsageError(f"{flag}: this user may not write in {job_dir}; fix its permissions or "
                     "use another --job_log_dir")


def _check_creatable(job_dir: epath.Path, flag: str) -> None:
  """The nearest existing ancestor must be a writable folder (local paths only)."""
  if paths.is_remote(str(job_dir)):
    return
  ancestor = job_dir.parent
  while not ancestor.exists() and ancestor != ancestor.parent:
    ancestor = ancestor.parent
  if not ancestor.is_dir():
    raise UsageError(f"{flag}: {ancestor} is a file, so the job folder cannot be created "
                     "under it; choose another --job_log_dir")
  if not os.access(ancestor, os.W_OK | os.X_OK):
    raise UsageError(f"{flag}: this user may not create folders in {ancestor}; choose "
                     "another --job_log_dir")
