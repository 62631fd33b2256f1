"""Files a user names for a program to read, opened so that none of them can hang it.

`open()` of a FIFO that no program writes to waits for a writer for ever; a terminal's
`read()` waits for typing; /dev/zero and /dev/urandom never end. Any path a user names (a
config.json, a model's safetensors or GGUF file, a tokenizer, a prompts file, a flag file, a
vocabulary model, a token store's manifest) may be one of those, by mistake or not. The rule,
kept here for every reader:

  - What a program reads by name must be a regular file (a symlink to one is one). A FIFO, a
    character or block device or a socket is refused in one line naming the path and its kind
    (UsageError: exit 2), before anything opens it.
  - `check(path, shown)` is that refusal, for a library that opens the file by its name itself
    (safetensors, gguf, tokenizers); `check_folder(folder, shown)`, for a folder whose files a
    library opens by names of its own (orbax); `read_bytes(path, shown)` opens the file
    without waiting (O_NONBLOCK), looks at what it opened (fstat, so nothing can be swapped in
    between the look and the read) and reads it.
  - One exception: a stream read once from its start to its end (`stream=True`: a flag file,
    a prompts file), which bash's `--flagfile=<(...)` gives as a pipe. A pipe that a program is
    writing into is read to its end; one that no program writes to (no writer, nothing in it)
    is refused as a FIFO would be.

What a file holds may be hostile too: `json_value` is `json.loads` for every JSON file or line a
program reads (a config.json, a job's metrics and records, a manifest, a tokenizer), whose every
failure is a ValueError, the one error its readers catch: JSON nested a hundred thousand deep
makes Python's parser raise RecursionError instead, which escaped them as a traceback.

A missing file, a folder or a file without read permission is the caller's to word (each
reader has its own fix for those): `check` lets them through, `read_bytes` raises the OSError.
A remote path (`gs://...`) names an object, never a special file: epath reads it.
"""

from __future__ import annotations

import json
import os
import select
import stat
from typing import Any

from etils import epath

from lingvo_lite import paths
from lingvo_lite.errors import UsageError

FIX = "give a regular file"
# The kinds a path may be besides a regular file or a folder, as messages name them.
_SPECIAL_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_CHUNK = 1 << 16


def json_value(text: str | bytes, **options: Any) -> Any:
  """`json.loads(text, **options)`, raising ValueError for every failure (module doc).

  Raises:
    ValueError: not JSON (json.JSONDecodeError), bytes that are not UTF-8
      (UnicodeDecodeError), or nesting deeper than Python's parser recurses.
  """
  try:
    return json.loads(text, **options)
  except RecursionError:
    raise ValueError("nested too deeply to be read (JSON nested thousands of levels)") from None


def special_kind(mode: int) -> str | None:
  """'a FIFO (named pipe)', 'a character device', ... for a file mode (`st_mode`) that is no
  regular file and no folder; None for those two."""
  for test, name in _SPECIAL_KINDS:
    if test(mode):
      return name
  return None


def kind_of(path: str | os.PathLike) -> str | None:
  """`special_kind` of the local `path` (symlinks followed); None for a regular file, a
  folder, a path that cannot be looked at (missing, no permission) or a remote one."""
  if paths.is_remote(os.fspath(path)):
    return None
  try:
    return special_kind(os.stat(os.fspath(path)).st_mode)
  except (OSError, ValueError):  # ValueError: a NUL in the name, which open() refuses too.
    return None


def refusal(shown: str, kind: str, fix: str = FIX) -> UsageError:
  """The one line refusing a file of `kind` (see `special_kind`) that `shown` names."""
  return UsageError(f"{shown}: is {kind}, not a regular file (reading it could wait or run "
                    f"for ever); {fix}")


def check(path: str | os.PathLike, shown: str, fix: str = FIX) -> None:
  """Refuses a local `path` that is a FIFO, a device or a socket, before a library opens it by
  its name.

  Args:
    path: The file, as it will be opened.
    shown: How the message names it: the flag or field and the value as the user wrote it
      (`--fdl_config_file=conf.json`, `hf:folder/model.safetensors`).
    fix: What to do instead.

  Raises:
    UsageError: `path` is no regular file and no folder (one line naming `shown` and its kind).
  """
  kind = kind_of(path)
  if kind is not None:
    raise refusal(shown, kind, fix)


def check_folder(folder: str | os.PathLike, shown: str, fix: str = FIX) -> None:
  """Refuses a FIFO, a device or a socket anywhere in a local `folder` whose files a library
  opens by names of its own (orbax reads a checkpoint's files without asking).

  Args:
    folder: The folder (a missing one, or a remote one, is the library's to report).
    shown: How the message names the folder; the file follows it, relative to the folder.
    fix: What to do instead.

  Raises:
    UsageError: naming the first such file (in sorted order) and its kind.
  """
  root = os.fspath(folder)
  if paths.is_remote(root):
    return
  for parent, folders, files in os.walk(root):
    folders.sort()
    for name in sorted(files):
      kind = kind_of(os.path.join(parent, name))
      if kind is not None:
        raise refusal(f"{shown}: {os.path.relpath(os.path.join(parent, name), root)}", kind,
                      fix)


def read_bytes(path: str | os.PathLike, shown: str, fix: str = FIX, limit: int | None = None,
               stream: bool = False) -> bytes:
  """The bytes of the file at `path`, which must be a regular file (or, with `stream`, may be
  a pipe being written), never waiting on a special file.

  Args:
    path: The file (a local path, or a URL epath opens).
    shown: How a refusal names it (see `check`).
    fix: What a refusal tells the user to do instead.
    limit: Read at most `limit + 1` bytes, so that the caller can refuse a file longer than
      `limit` without reading all of it; None reads the whole file.
    stream: A pipe that a program is writing into is read to its end (bash's `<(...)`).

  Raises:
    UsageError: the file is a FIFO (with `stream`: a pipe no program writes to), a device or
      a socket.
    OSError: it cannot be opened or read (missing, a folder, no permission): the caller's to
      word.
  """
  text = os.fspath(path)
  if paths.is_remote(text):
    data = epath.Path(text).read_bytes()
    return data if limit is None else data[:limit + 1]
  # O_NONBLOCK: opening a FIFO for reading does not wait for a writer; a regular file or a
  # folder ignores it.
  descriptor = os.open(text, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
  try:
    mode = os.fstat(descriptor).st_mode
    kind = special_kind(mode)
    if kind is None:
      os.set_blocking(descriptor, True)
      return _read(descriptor, limit)
    if not (stream and stat.S_ISFIFO(mode)):
      raise refusal(shown, kind, fix)
    return _read_pipe(descriptor, shown, fix, limit)
  finally:
    os.close(descriptor)


def _read(descriptor: int, limit: int | None) -> bytes:
  chunks, size = [], 0
  while limit is None or size <= limit:
    chunk = os.read(descriptor, _CHUNK if limit is None else min(_CHUNK, limit + 1 - size))
    if not chunk:
      break
    chunks.append(chunk)
    size += len(chunk)
  return b"".join(chunks)


def _read_pipe(descriptor: int, shown: str, fix: str, limit: int | None) -> bytes:
  """A pipe opened without waiting, read to its end: an empty read before any wait means no
  program has it open for writing (Linux gives EOF then, not EAGAIN)."""
  chunks, size, waited = [], 0, False
  while limit is None or size <= limit:
    try:
      chunk = os.read(descriptor, _CHUNK)
    except BlockingIOError:  # A writer, which has not written yet: wait for it.
      select.select([descriptor], [], [])
      waited = True
      continue
    if not chunk:
      if not chunks and not waited:
        raise UsageError(f"{shown}: is a FIFO (named pipe) that no program is writing to "
                         f"(reading it would wait for ever); {fix}")
      break
    chunks.append(chunk)
    size += len(chunk)
  return b"".join(chunks)
