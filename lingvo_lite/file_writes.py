"""Writing a job's small files so that a full disk loses nothing and leaves nothing behind.

A training run appends to its metric files and rewrites them and its config when a checkpoint
is verified; on a full disk any of those writes can fail. Three rules, kept here:

  - A file rewritten whole goes through a temporary file and a rename (`replace`), and the
    temporary is removed whatever happens: a failed rewrite leaves the old file as it was and
    no `.tmp` beside it.
  - Taking back what was appended cuts the file back (`truncate`): that needs no free space,
    where writing the old contents again would. So does dropping a file's last rows or
    records (`shrink`), which rewrites it whole only where the rows dropped are not its last.
  - An OSError raised while writing names the file being written (`writing`), not the
    temporary, so that the run's one line says which file could not be written.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from etils import epath

from lingvo_lite import paths


@contextlib.contextmanager
def writing(path: epath.Path | str) -> Iterator[None]:
  """OSErrors raised in the block come out naming `path` (its `filename`), with their errno."""
  try:
    yield
  except OSError as e:
    if e.filename == str(path):
      raise
    # OSError(errno, ...) picks the subclass of the errno (FileNotFoundError, ...) itself.
    raise OSError(e.errno, e.strerror or str(e) or type(e).__name__, str(path)) from e


def replace(path: epath.Path, data: bytes) -> None:
  """Writes `path` whole (paths.write_atomically): a reader sees the old file or the new one,
  never a part; a failure names the file."""
  with writing(path):
    paths.write_atomically(path, data)


def truncate(path: epath.Path, length: int) -> None:
  """Cuts `path` back to its first `length` bytes: in place on a local disk (no free space
  needed), else by `replace` (an object store has no truncation)."""
  with writing(path):
    if paths.is_remote(str(path)):
      replace(path, path.read_bytes()[:length])
    else:
      os.truncate(os.fspath(path), length)


def shrink(path: epath.Path, old: bytes, new: bytes) -> None:
  """Makes `path`, which holds `old`, hold `new` (what is left of `old` once some of its rows
  or records are dropped): cut back in place where `new` is how `old` begins (the rows dropped
  are the last ones: no free space needed), else rewritten whole (`replace`). Nothing is
  written where they are equal."""
  if new == old:
    return
  if old.startswith(new):
    truncate(path, len(new))
  else:
    replace(path, new)
