"""Checksums of a finished checkpoint, written beside it and verified before it is restored.

orbax (tensorstore) restores a checkpoint whose data file has a flipped byte without
complaint, and a silently corrupted state then trains on. So once a step's files are final,
process 0 records every file's size and CRC-32 in `<step>/CHECKSUMS_FILE`; a restore first
checks them and names the first file that differs.
"""

from __future__ import annotations

import json
import zlib

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


def write_checksums(step_dir: epath.Path) -> None:
  """Records size and CRC-32 of every file under `step_dir` (atomically: temp, then rename;
  no temporary is left when the write fails)."""
  entries = {str(p.relative_to(step_dir)): {"bytes": p.stat().length, "crc32": _crc32(p)}
             for p in _files(step_dir)}
  temporary = step_dir / (CHECKSUMS_FILE + ".tmp")
  try:
    temporary.write_text(json.dumps(entries, indent=1, sort_keys=True))
    temporary.rename(step_dir / CHECKSUMS_FILE)
  finally:
    if temporary.exists():  # A failed write (a full disk) leaves no half file.
      temporary.unlink()


def has_checksums(step_dir: epath.Path) -> bool:
  return (step_dir / CHECKSUMS_FILE).exists()


def first_mismatch(step_dir: epath.Path) -> str | None:
  """None if every recorded file is present with its size and CRC-32; else what differs."""
  special = input_files.kind_of(step_dir / CHECKSUMS_FILE)
  if special is not None:  # Reading a FIFO would wait for ever.
    return f"{CHECKSUMS_FILE} is {special}, not a regular file"
  try:
    recorded = {name: (int(entry["bytes"]), str(entry["crc32"])) for name, entry in
                json.loads((step_dir / CHECKSUMS_FILE).read_text()).items()}
  except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as e:
    return f"{CHECKSUMS_FILE} is unreadable ({type(e).__name__}: {e})"
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
