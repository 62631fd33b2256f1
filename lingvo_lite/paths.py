"""Paths as users write them, made usable everywhere at the edge of the program.

Users and the README write relative paths (`--job_log_dir=runs/a`); orbax refuses relative
checkpoint paths, and a relative path recorded in a config would mean something else when
the config is replayed from another folder. So the executor resolves every local path it is
given once, against the working directory, and leaves remote URLs (`gs://...`) as they are.
A `file://` URL is a local path in another spelling, so it becomes one (etils.epath itself has
no `file://` scheme).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import urllib.parse
from typing import Iterator

from etils import epath
from etils.epath import register

from lingvo_lite.errors import UsageError

_FILE_SCHEME = "file://"


def is_remote(text: str) -> bool:
  """`gs://bucket/x`, `s3://...`: anything with a scheme, which epath opens itself."""
  return "://" in text


def resolve(text: str | os.PathLike, flag: str | None = None) -> epath.Path:
  """An absolute local path (`~` expanded, against the working directory) or the URL as is.

  Args:
    text: The path as the user wrote it.
    flag: The flag that gave it (`--job_log_dir`), for messages.

  Raises:
    UsageError: a URL of a scheme epath cannot open, a `file://` URL naming another host, a
      relative path while the working directory is gone, a path holding a NUL character
      (which no file name can hold: every os call on it raises ValueError, wherever the path
      is first used), or a local path that is not valid UTF-8 (TensorBoard's writer and
      tensorstore take only UTF-8 path names, and would fail only once training has run).
  """
  text = os.fspath(text)
  shown = f"{flag}={_printable(text)}" if flag else repr(text)
  _refuse_nul(text, shown)
  if text.startswith(_FILE_SCHEME):
    text = _local_path_of_file_url(text, shown)
    _refuse_nul(text, shown)  # `file:///a%00b`
  elif is_remote(text):
    scheme = text.split("://", 1)[0] + "://"
    if scheme not in register._URI_PREFIXES_TO_CLS:  # pylint: disable=protected-access
      # epath would raise a bare KeyError for it.
      known = ", ".join(sorted(register._URI_PREFIXES_TO_CLS))  # pylint: disable=protected-access
      raise UsageError(f"{shown}: unknown URL scheme {scheme!r}; give a local path, a "
                       f"file:// URL, or a URL of one of {known}")
    return epath.Path(text)
  expanded = os.path.expanduser(text)
  try:
    absolute = os.path.abspath(expanded)
  except OSError as e:  # getcwd() fails once the working directory has been deleted.
    raise UsageError(f"{shown}: is relative, but the working directory is gone "
                     f"({e.strerror or e}); cd to an existing folder or give an absolute "
                     "path") from None
  try:
    absolute.encode("utf-8")
  except UnicodeEncodeError:
    raise UsageError(f"{shown}: the path {_printable(absolute)} is not valid UTF-8, which "
                     "TensorBoard and the checkpoint library need; rename the folder, or give "
                     "another path") from None
  return epath.Path(absolute)


def _refuse_nul(text: str, shown: str) -> None:
  """argv cannot hold a NUL, but a flag file's line, a config.json, a file:// URL's `%00` or
  a tool's caller can; os.stat and open would raise a bare ValueError on it."""
  if "\0" in text:
    raise UsageError(f"{shown}: holds a NUL character (\\x00), which no file name can hold; "
                     "give the path without it")


def _printable(text: str) -> str:
  """`text` with the bytes it really has where they are not UTF-8 (`j\\xff`): argv bytes that
  do not decode arrive as lone surrogates, which no terminal shows."""
  try:
    return os.fsencode(text).decode("utf-8", "backslashreplace")
  except UnicodeEncodeError:  # A surrogate that no byte decodes to: not from argv.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _local_path_of_file_url(url: str, shown: str) -> str:
  """`file:///abs/path` or `file://localhost/abs/path` -> `/abs/path` (RFC 8089).

  Percent escapes are decoded (`Path.as_uri()` writes them); `?` and `#` stay part of the
  path, as they are in a file name.
  """
  host, _, path = url[len(_FILE_SCHEME):].partition("/")
  if host not in ("", "localhost"):
    raise UsageError(f"{shown}: names host {host!r}; a file:// URL must name a local path "
                     "(file:///ABSOLUTE/PATH), or give the path itself")
  return urllib.parse.unquote("/" + path)


def write_atomically(path: epath.Path, content: str | bytes) -> None:
  """Writes `path` through a temporary file of this process's own and a rename: a reader,
  a kill mid-write or another process writing the same file at the same time (two compiles
  into one job) only ever sees a whole version of it.

  The temporary's name never holds the file's own: TensorBoard reads every file whose name
  holds `tfevents`, a half-written copy included.
  """
  temporary = path.parent / f".lingvo_lite_rewrite.{os.getpid()}.{os.urandom(4).hex()}.tmp"
  try:
    if isinstance(content, bytes):
      temporary.write_bytes(content)
    else:
      temporary.write_text(content)
    temporary.replace(path)
  finally:
    if temporary.exists():
      temporary.unlink()


@contextlib.contextmanager
def exclusive_lock(lock_file: str | os.PathLike, waiting: str | None = None) -> Iterator[None]:
  """Holds an exclusive lock on a local `lock_file` (made if absent, left in place), so that
  of several processes making the same thing (a token store, a vocabulary) one makes it and
  the others wait, then find it made. `waiting`, if given, is printed when this one waits.
  The kernel drops the lock with the process, so a killed holder never blocks the rest."""
  with open(lock_file, "a") as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      if waiting:
        print(waiting, file=sys.stderr, flush=True)
      fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def is_read_only_mount(path: str | os.PathLike) -> bool:
  """Whether the local `path` is on a file system mounted read-only (where "permission
  denied" would be the wrong name for the refusal: no chmod helps)."""
  try:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
  except OSError:
    return False


def creation_problem(folder: str | os.PathLike) -> OSError | None:
  """Why nothing can be created in the local `folder`, found by trying: an empty temporary
  folder is made there and removed at once (the one change, undone). `access()` answers yes
  to root everywhere, /proc refuses what it allows, and only the attempt says whether the
  disk is full; None when a file or folder can be created there."""
  try:
    probe = tempfile.mkdtemp(prefix=".lingvo_lite-probe-", dir=os.fspath(folder))
  except OSError as e:
    return e
  os.rmdir(probe)
  return None
