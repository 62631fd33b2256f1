"""Checksums of a finished checkpoint, written beside it and verified before it is restored.

orbax (tensorstore) restores a checkpoint whose data file has a flipped byte without
complaint, and a silently corrupted state then trains on. So once a step's files are final,
process 0 records every file's size and CRC-32 in `<step>/CHECKSUMS_FILE`, with the step they
are; a restore first checks them and names the first file that differs.

The step recorded with them makes a step folder's identity checkable: a folder copied or
renamed from another step's (`checkpoints/55` copied to `checkpoints/57`) holds a record that
names step 55. Records written before they named their step (a flat `{file: entry}` object)
are read as before; their step is checked on the restored state's step counter alone.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from etils import epath

from lingvo_lite import input_files

CHECKSUMS_FILE = "lingvo_lite_checksums.json"
_CHUNK_BYTES = 1 << 22


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


def write_checksums(step_dir: epath.Path, step: int) -> None:
  """Records size and CRC-32 of every file under `step_dir`, and that they are step `step`
  (atomically: temp, then rename; no temporary is left when the write fails)."""
  entries = {str(p.relative_to(step_dir)): {"bytes": p.stat().length, "crc32": _crc32(p)}
             for p in _files(step_dir)}
  temporary = step_dir / (CHECKSUMS_FILE + ".tmp")
  try:
    temporary.write_text(json.dumps({"step": step, "files": entries}, indent=1,
                                    sort_keys=True))
    temporary.rename(step_dir / CHECKSUMS_FILE)
  finally:
    if temporary.exists():  # A failed write (a full disk) leaves no half file.
      temporary.unlink()


def has_checksums(step_dir: epath.Path) -> bool:
  return (step_dir / CHECKSUMS_FILE).exists()


def _read(step_dir: epath.Path) -> tuple[int | None, dict[str, Any]]:
  """(the recorded step, or None in a record from before records named it; the file
  entries). Raises what reading or parsing the file raises."""
  if input_files.kind_of(step_dir / CHECKSUMS_FILE) is not None:
    raise ValueError(f"{CHECKSUMS_FILE} is not a regular file")  # A FIFO would never end.
  record = json.loads((step_dir / CHECKSUMS_FILE).read_text())
  # An old record's values are all entries (objects): a "step" that is a number is the new form.
  if isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(
      record.get("files"), dict):
    return record["step"], record["files"]
  return None, record


def step_mismatch(step_dir: epath.Path, step: int) -> str | None:
  """What says that `step_dir` holds another step than `step`: its record names another one.
  None where it names `step`, names none (an older record), or cannot be read
  (`first_mismatch` reports that)."""
  try:
    recorded, _ = _read(step_dir)
  except (OSError, ValueError):
    return None
  return None if recorded is None or recorded == step else _another_step(recorded)


def _another_step(recorded: int) -> str:
  return (f"its {CHECKSUMS_FILE} was recorded for step {recorded} (the folder is a copy or a "
          f"rename of step {recorded}'s)")


_UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError)


def first_mismatch(step_dir: epath.Path) -> str | None:
  """None if the record names the folder's step (where the folder's name is a step) and
  every recorded file is present with its size and CRC-32; else what differs."""
  special = input_files.kind_of(step_dir / CHECKSUMS_FILE)
  if special is not None:  # Reading a FIFO would wait for ever.
    return f"{CHECKSUMS_FILE} is {special}, not a regular file"
  try:
    recorded_step, entries = _read(step_dir)
    recorded = {name: (int(entry["bytes"]), str(entry["crc32"]))
                for name, entry in entries.items()}
  except _UNREADABLE as e:
    return f"{CHECKSUMS_FILE} is unreadable ({type(e).__name__}: {e})"
  if recorded_step is not None and step_dir.name.isdigit() and (
      recorded_step != int(step_dir.name)):
    return _another_step(recorded_step)
  for name, (size, crc32) in sorted(recorded.items()):
    path = step_dir / name
    if not path.exists():
      return f"{name} is missing"
    on_disk = path.stat().length
    if on_disk != size:
      return f"{name} has {on_disk} bytes, {size} were written"
    if _crc32(path) != crc32:
      return f"{name} does not match the CRC-32 recorded when it was written"
  return None
