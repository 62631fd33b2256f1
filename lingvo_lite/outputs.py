"""Where a program puts its results, and what it may replace there.

Every program that writes results (decode's completions, compile's report and saved step, the
report's pages, an export) follows the same rules, kept here:

  - A program never replaces a file or folder it did not write. Its own earlier output, a
    folder whose manifest.json names lingvo_lite and the kind of output (`"schema":
    "lingvo_lite.compiled_step/1"`) and holds nothing else, may be replaced: whole and at
    once (written beside it, then renamed into place), and the program says so.
  - No output goes inside a job's `checkpoints/` folder, with symlinks and `..` resolved:
    checkpoint retention deletes a step's folder with whatever was put into it.
  - Both are refused in one line naming the flag, the path and the fix (UsageError, exit 2),
    before any device time is spent. A closed stdout that must carry results is refused
    then too, as a write of results that cannot succeed (OutputFailure, exit 1).
  - Folders are created only when there is something to write, and a failed write removes
    what it created: a failed run leaves the disk as it found it.
  - A failed write is one line (`failed_write`, exit 1) that names the failure by its errno
    (a full disk, a read-only file system, a reader that closed the pipe), never a generic
    "free space or fix the permissions".

Here: stdout as a destination, the refusals of a destination, and folders created and removed
again; a folder an output is written into whole (a compiled step, an export) is
output_folders.py's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import Iterator

from etils import epath

from lingvo_lite import paths
from lingvo_lite.errors import OutputFailure, UsageError, os_error_text

MANIFEST = "manifest.json"
CHECKPOINTS = "checkpoints"
# What marks a folder as a training job's: a checkpoints/ folder beside it is that job's.
_JOB_MARKER = "config.json"


def schema(kind: str, version: int = 1) -> str:
  """The `schema` a manifest of lingvo_lite's `kind` of output records: `lingvo_lite.KIND/N`."""
  return f"lingvo_lite.{kind}/{version}"


def real(path: epath.Path | str) -> str:
  """`path` with symlinks and `..` resolved (a local path)."""
  return os.path.realpath(os.fspath(path))


def _is_within(path: str, folder: str) -> bool:
  return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def refuse_inside_checkpoints(path: epath.Path, flag: str, job_dir: epath.Path | None) -> None:
  """Refuses an output at or below the job's checkpoints/ folder, or any training job's
  (a `checkpoints` folder beside a config.json), symlinks and `..` resolved.

  Raises:
    UsageError: naming the flag, the checkpoints folder and the fix.
  """
  if paths.is_remote(str(path)):
    return
  resolved = real(path)
  folders = [real(job_dir / CHECKPOINTS)] if job_dir is not None and not paths.is_remote(
      str(job_dir)) else []
  ancestor = resolved
  while os.path.dirname(ancestor) != ancestor:
    parent = os.path.dirname(ancestor)
    if os.path.basename(ancestor) == CHECKPOINTS and os.path.isfile(
        os.path.join(parent, _JOB_MARKER)):
      folders.append(ancestor)
    ancestor = parent
  for folder in folders:
    if _is_within(resolved, folder):
      raise UsageError(f"{flag}: is inside the job's checkpoints folder {folder}, whose "
                       "steps checkpoint retention deletes with whatever is in them; write "
                       "it outside checkpoints/")


def check_stdout(flag: str, fix: str) -> None:
  """Refuses stdout as the destination of results when it is closed (`>&-`): Python then
  drops every print silently, and the results would be lost under a success message.

  Raises:
    OutputFailure: exit 1, as any write of results that fails (the command is right; where
      its results must go is not there).
  """
  if sys.stdout is None or getattr(sys.stdout, "closed", False):
    raise OutputFailure(f"{flag}: stdout is closed, so the results would be lost; {fix}")


class StdoutWriteError(OSError):
  """A write or flush of stdout failed (its reader closed the pipe, its disk is full); raised
  by `stdout_failures` in place of the OSError, with its errno."""


class _WatchedStdout:
  """sys.stdout, passed through, recording each OSError its writes and flushes raise."""

  def __init__(self, stream):
    self.stream = stream
    self.failures: list[OSError] = []

  def write(self, text):
    try:
      return self.stream.write(text)
    except OSError as e:
      self.failures.append(e)
      raise

  def flush(self):
    try:
      return self.stream.flush()
    except OSError as e:
      self.failures.append(e)
      raise

  def __getattr__(self, name):
    return getattr(self.stream, name)


@contextlib.contextmanager
def stdout_failures() -> Iterator[None]:
  """Within: an OSError that a print to stdout raised, and that nothing inside handled, comes
  out as a StdoutWriteError, told apart from the same errno met writing a file (a full disk
  is ENOSPC either way, and only stdout's is the output's failure). A BrokenPipeError counts
  as stdout's too, as its only pipe."""
  watched = None
  if sys.stdout is not None and not getattr(sys.stdout, "closed", False):
    watched = sys.stdout = _WatchedStdout(sys.stdout)
  try:
    yield
  except OSError as e:
    if isinstance(e, StdoutWriteError) or not (
        isinstance(e, BrokenPipeError) or any(e is failure for failure in
                                              (watched.failures if watched else ()))):
      raise
    raise StdoutWriteError(e.errno, e.strerror) from e
  finally:
    if watched is not None and sys.stdout is watched:
      sys.stdout = watched.stream


def print_summary(line: str) -> None:
  """Prints the closing summary of a run whose results are files (a store, a model, a report): a
  stdout that fails (a full disk, a reader that closed the pipe) costs the summary alone, as
  decode's closing message, so it is silenced, not a traceback or a run stopped halfway."""
  try:
    print(line, flush=True)
  except OSError:
    silence_stdout()


def silence_stdout() -> None:
  """After a write to stdout failed (its reader closed the pipe, its disk is full): what is
  still buffered, later prints and the flush at exit go to /dev/null, so that the one error
  line is all the user sees (no "Exception ignored ... BrokenPipeError" at interpreter
  shutdown, no second failure of a later message)."""
  silence(sys.stdout)


def silence(stream) -> bool:
  """Points `stream`'s file descriptor at /dev/null: what is buffered and later writes go
  nowhere, without an error. False where it has none (a buffer in memory, in tests)."""
  try:
    descriptor = stream.fileno()
  except (AttributeError, ValueError, OSError):
    return False
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, descriptor)
  finally:
    os.close(devnull)
  return True


def failed_write(what: str, error: OSError, then: str, to_stdout: bool = False) -> str:
  """The one line of a write of results that failed: `cannot write WHAT: PROBLEM (ERRNO);
  FIX, then THEN`. A stdout that failed is silenced as well (see silence_stdout)."""
  if to_stdout:
    silence_stdout()
  problem, fix = os_error_text(error, "write to a file" if to_stdout else "write elsewhere")
  return f"cannot write {what}: {problem}; {fix}, then {then}"


def refusal(flag: str, error: OSError, action: str, alternative: str) -> UsageError:
  """`FLAG: cannot ACTION: PROBLEM (ERRNO); FIX` for a destination found unwritable before
  anything ran (by paths.creation_problem); the errno's own remedy first (remount, free
  space, fix the permissions), then `alternative`."""
  if error.errno == errno.ENOENT:  # The folder is there, so it is one that takes no entries.
    problem, fix = "that file system takes no new files (ENOENT)", alternative
  else:
    problem, fix = os_error_text(error, alternative)
  return UsageError(f"{flag}: cannot {action}: {problem}; {fix}")


def check_creatable(path: epath.Path, flag: str, fix: str) -> None:
  """Refuses `path` (a file or folder to create) when its nearest existing folder takes no
  new entries (tried: see paths.creation_problem)."""
  if paths.is_remote(str(path)):
    return
  # Absolute: the walk up a relative path would end at '', which never exists.
  parent = os.path.dirname(os.path.abspath(os.fspath(path)))
  while not os.path.lexists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UsageError(f"{flag}: {parent} is a file, not a folder; {fix}")
  problem = paths.creation_problem(parent)
  if problem is not None:
    raise refusal(flag, problem, f"create a folder in {parent}", fix)


@contextlib.contextmanager
def created_folders(folder: epath.Path) -> Iterator[bool]:
  """Creates `folder` and its missing parents; if the block fails, removes the ones it created
  (those still empty), so that a failed write leaves no empty folders behind. Yields whether
  `folder` itself is new (then what the block wrote in it is its own to remove on failure)."""
  if paths.is_remote(str(folder)):
    folder.mkdir(parents=True, exist_ok=True)
    yield False
    return
  missing, path = [], os.path.abspath(os.fspath(folder))  # See check_creatable.
  while not os.path.lexists(path):
    missing.append(path)
    path = os.path.dirname(path)
  created = []
  try:
    for path in reversed(missing):
      os.mkdir(path)
      created.append(path)
    yield bool(created)
  except BaseException:
    remove_empty_folders(created)
    raise


def remove_empty_folders(created: list[str]) -> None:
  """Removes the folders a failed run `created` (parents first in the list), deepest first,
  each only while empty."""
  for path in reversed(created):
    try:
      os.rmdir(path)
    except OSError:
      return  # Not empty (someone else's files), or gone: left as it is.


def publish(partial: epath.Path, final: epath.Path) -> None:
  """Renames a finished `partial` file to `final`, which must not exist: unlike a rename, a
  file that appeared at `final` meanwhile is never replaced (FileExistsError instead).

  Raises:
    OSError: FileExistsError when `final` exists; whatever the file system raises.
  """
  if paths.is_remote(str(final)):
    if final.exists():
      raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(final))
    partial.rename(final)
    return
  try:
    os.link(os.fspath(partial), os.fspath(final))  # Fails with EEXIST; a rename would replace.
  except OSError as e:
    if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
      raise
    # A file system without hard links: the check and the rename are as close as it allows.
    if os.path.lexists(os.fspath(final)):
      raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(final)) from None
    os.rename(os.fspath(partial), os.fspath(final))
    return
  os.unlink(os.fspath(partial))
