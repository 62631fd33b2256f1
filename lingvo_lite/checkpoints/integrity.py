"""Checksums of a finished checkpoint, written beside it and verified before it is restored.

orbax (tensorstore) restores a checkpoint whose data file has a flipped byte without
complaint, and a silently corrupted state then trains on. So once a step's files are final,
process 0 records every file's size and CRC-32 in `<step>/CHECKSUMS_FILE`, with the step they
are and the job that wrote them; a restore first checks them and names the first file that
differs.

The record's form is versioned (`Record.format`): 1, a flat `{file: entry}` object (before
records named their step); 2, `{"step", "files"}`; 3 (`FORMAT`, what this version writes),
`{"format", "step", "job", "files"}`. Every form is read and its files checked as before. The
step recorded makes a step folder's identity checkable: a folder copied or renamed from
another step's (`checkpoints/55` copied to `checkpoints/57`) holds a record that names step 55
(a format-1 record's step is checked on the restored state's step counter alone). The job
recorded (an id a training run takes over from the step it resumes from, or makes new:
`Checkpointer.job`) tells the job's own steps from copies: `not_own` says why a folder cannot
be verified as this job's, and checkpoint retention deletes none of those.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Any

from etils import epath

from lingvo_lite import input_files

CHECKSUMS_FILE = "lingvo_lite_checksums.json"
FORMAT = 3  # The record form this version writes (see the module doc).
_CHUNK_BYTES = 1 << 22
# What reading a record that is not what this module writes may raise (a crafted or damaged
# file: JSON nested past the recursion limit, an entry that is no object, a size of 1e400).
_UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError,
               RecursionError)


def _crc32(path: epath.Path) -> str:
  crc = 0
  with path.open("rb") as f:
    while chunk := f.read(_CHUNK_BYTES):
      crc = zlib.crc32(chunk, crc)
  return f"{crc:08x}"


def _files(step_dir: epath.Path) -> list[epath.Path]:
  # walk(), not rglob("**"): epath refuses recursive globs (on GCS each level is a request).
  return sorted(directory / name for directory, _, names in step_dir.walk() for name in names
                if name != CHECKSUMS_FILE)


def write_checksums(step_dir: epath.Path, step: int, job: str) -> None:
  """Records size and CRC-32 of every file under `step_dir`, and that they are step `step`
  written by job `job` (atomically: temp, then rename; no temporary is left when the write
  fails)."""
  entries = {str(p.relative_to(step_dir)): {"bytes": p.stat().length, "crc32": _crc32(p)}
             for p in _files(step_dir)}
  temporary = step_dir / (CHECKSUMS_FILE + ".tmp")
  try:
    temporary.write_text(json.dumps({"format": FORMAT, "step": step, "job": job,
                                     "files": entries}, indent=1, sort_keys=True))
    temporary.rename(step_dir / CHECKSUMS_FILE)
  finally:
    if temporary.exists():  # A failed write (a full disk) leaves no half file.
      temporary.unlink()


def has_checksums(step_dir: epath.Path) -> bool:
  return (step_dir / CHECKSUMS_FILE).exists()


@dataclasses.dataclass(frozen=True)
class Record:
  """A step's record, in any form (see the module doc).

  Attributes:
    format: 1, 2 or 3 (or a newer version's number, read as far as its fields go).
    step: The step it was recorded for (None in format 1).
    job: The id of the job that wrote it (None before format 3).
    files: {relative path: {"bytes": size, "crc32": hex}}.
  """
  format: int
  step: int | None
  job: str | None
  files: dict[str, Any]


def read_record(step_dir: epath.Path) -> Record:
  """The step's record. Raises what reading or parsing the file raises (OSError,
  ValueError, RecursionError)."""
  if input_files.kind_of(step_dir / CHECKSUMS_FILE) is not None:
    raise ValueError(f"{CHECKSUMS_FILE} is not a regular file")  # A FIFO would never end.
  record = input_files.json_value((step_dir / CHECKSUMS_FILE).read_text())
  if not isinstance(record, dict):
    raise ValueError(f"{CHECKSUMS_FILE} holds no JSON object")
  # A format-1 record's values are all entries (objects): a "step" that is a number and a
  # "files" object are a later form, whose "format" says which (none: 2).
  if not (_is_int(record.get("step")) and isinstance(record.get("files"), dict)):
    return Record(1, None, None, record)
  version = record.get("format", 2)
  job = record.get("job")
  return Record(version if _is_int(version) else 0, record["step"],
                job if isinstance(job, str) else None, record["files"])


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def step_mismatch(step_dir: epath.Path, step: int) -> str | None:
  """What says that `step_dir` holds another step than `step`: its record names another one.
  None where it names `step`, names none (a format-1 record), or cannot be read
  (`first_mismatch` reports that)."""
  try:
    recorded = read_record(step_dir).step
  except _UNREADABLE:
    return None
  return None if recorded is None or recorded == step else _another_step(recorded)


def recorded_job(step_dir: epath.Path) -> str | None:
  """The job id of a step's record of this version's form; None for any other record, or
  none."""
  try:
    record = read_record(step_dir)
  except _UNREADABLE:
    return None
  return record.job if record.format == FORMAT else None


def not_own(step_dir: epath.Path, step: int, job: str) -> str | None:
  """Why `step_dir` cannot be verified as step `step` of job `job`, recorded as this version
  records its own steps (`its lingvo_lite_checksums.json was recorded by another job`); None
  where it can. Reads the record alone, not the files (`first_mismatch` does)."""
  if not has_checksums(step_dir):
    return f"it has no {CHECKSUMS_FILE}"
  try:
    record = read_record(step_dir)
  except _UNREADABLE as e:
    return f"its {CHECKSUMS_FILE} is unreadable ({type(e).__name__}: {e})"
  if record.step is not None and record.step != step:
    return _another_step(record.step)
  if record.format != FORMAT:
    return (f"its {CHECKSUMS_FILE} is of record format {record.format}, not {FORMAT} (written "
            "by another version of lingvo_lite, or copied from a job it wrote)")
  if record.job != job:
    return f"its {CHECKSUMS_FILE} was recorded by another job (the folder is a copy)"
  return None


def _another_step(recorded: int) -> str:
  return (f"its {CHECKSUMS_FILE} was recorded for step {recorded} (the folder is a copy or a "
          f"rename of step {recorded}'s)")


def first_mismatch(step_dir: epath.Path, contents: bool = True) -> str | None:
  """None if the record names the folder's step (where the folder's name is a step) and
  every recorded file is present with its size and (with `contents`) its CRC-32; else what
  differs. A file that cannot be read is a mismatch (its reason), never an exception."""
  special = input_files.kind_of(step_dir / CHECKSUMS_FILE)
  if special is not None:  # Reading a FIFO would wait for ever.
    return f"{CHECKSUMS_FILE} is {special}, not a regular file"
  try:
    record = read_record(step_dir)
    recorded = {name: (int(entry["bytes"]), str(entry["crc32"]))
                for name, entry in record.files.items()}
  except _UNREADABLE as e:
    return f"{CHECKSUMS_FILE} is unreadable ({type(e).__name__}: {e})"
  if record.step is not None and step_dir.name.isdigit() and (
      record.step != int(step_dir.name)):
    return _another_step(record.step)
  for name, (size, crc32) in sorted(recorded.items()):
    problem = _file_mismatch(step_dir / name, name, size, crc32 if contents else None)
    if problem is not None:
      return problem
  return None


def _file_mismatch(path: epath.Path, name: str, size: int, crc32: str | None) -> str | None:
  try:
    if not path.exists():
      return f"{name} is missing"
    special = input_files.kind_of(path)
    if special is not None:  # Reading it could wait for ever.
      return f"{name} is {special}, not a regular file"
    on_disk = path.stat().length
    if on_disk != size:
      return f"{name} has {on_disk} bytes, {size} were written"
    if crc32 is not None and _crc32(path) != crc32:
      return f"{name} does not match the CRC-32 recorded when it was written"
  except OSError as e:  # No permission, an I/O error: the step cannot be trusted either.
    return f"{name} {CANNOT_BE_READ} ({e.strerror or type(e).__name__})"
  return None


CANNOT_BE_READ = "cannot be read"  # How a mismatch says that a file could not be read at all.
