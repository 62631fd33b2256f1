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

Longer than 300 lines with a reason: the rules above are one policy, and its parts (checking stdout,
refusing a destination, writing a folder whole with `FolderOutput` and `write_folder`) share its
refusal messages and the removal of the folders a failed write created.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
import stat
import sys
from typing import Callable, Iterator

from etils import epath

from lingvo_lite import paths
from lingvo_lite.errors import OutputFailure, UsageError, os_error_text, shown

MANIFEST = "manifest.json"
CHECKPOINTS = "checkpoints"
# Larger than any manifest lingvo_lite writes (a compiled step's is a few KiB).
_MANIFEST_LIMIT = 16 << 20
# What marks a folder as a training job's: a checkpoints/ folder beside it is that job's.
_JOB_MARKER = "config.json"


def schema(kind: str, version: int = 1) -> str:
  """The `schema` a manifest of lingvo_lite's `kind` of output records: `lingvo_lite.KIND/N`."""
  return f"lingvo_lite.{kind}/{version}"


def _real(path: epath.Path | str) -> str:
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
  real = _real(path)
  folders = [_real(job_dir / CHECKPOINTS)] if job_dir is not None and not paths.is_remote(
      str(job_dir)) else []
  ancestor = real
  while os.path.dirname(ancestor) != ancestor:
    parent = os.path.dirname(ancestor)
    if os.path.basename(ancestor) == CHECKPOINTS and os.path.isfile(
        os.path.join(parent, _JOB_MARKER)):
      folders.append(ancestor)
    ancestor = parent
  for folder in folders:
    if _is_within(real, folder):
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


# ----------------------------------------------------------------------------- output folders

_MISSING, _EMPTY, _OURS = "missing", "empty", "ours"


@dataclasses.dataclass(frozen=True)
class FolderOutput:
  """A folder a program writes whole: `files`, one of them MANIFEST with `schema(kind)`.

  Attributes:
    path: The resolved folder.
    flag: The flag and its value as the user wrote them, for messages.
    kind: The kind of output (`compiled_step`), named in its manifest's schema.
    files: The names the program writes there; a folder holding anything else is not its own.
    label: What the output is called in messages (`the compiled step`).
  """

  path: epath.Path
  flag: str
  kind: str
  files: tuple[str, ...]
  label: str

  def state(self) -> str:
    """_MISSING, _EMPTY or _OURS (lingvo_lite's earlier output of this kind).

    Raises:
      UsageError: something else is there: a file, a dangling link, another kind of output,
        or a folder with files lingvo_lite did not write.
    """
    flag, path = self.flag, os.fspath(self.path)
    if paths.is_remote(path):
      return _remote_state(self)
    if not os.path.lexists(path):
      return _MISSING
    if not os.path.exists(path):
      raise UsageError(f"{flag}: is a symlink whose target does not exist (-> "
                       f"{os.readlink(path)}); remove the link, or name another folder")
    if not os.path.isdir(path):
      raise UsageError(f"{flag}: exists and is not a folder; name a new or existing folder")
    try:
      entries = sorted(os.listdir(path))
    except OSError as e:
      problem, fix = os_error_text(e, "name another folder")
      raise UsageError(f"{flag}: cannot list {path}: {problem}; {fix}") from None
    if not entries:
      return _EMPTY
    foreign = [name for name in entries if name not in self.files]
    recorded = self._recorded_schema()
    if recorded is None or not recorded.startswith(f"lingvo_lite.{self.kind}/"):
      if recorded and recorded.startswith("lingvo_lite."):
        raise UsageError(f"{flag}: the folder holds another kind of lingvo_lite output "
                         f"({shown(recorded)}), which is not replaced; name a new or empty "
                         "folder")
      listed = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
      raise UsageError(f"{flag}: the folder holds files lingvo_lite did not write ({listed}), "
                       "and it never replaces them; name a new or empty folder, or move them "
                       "away")
    if foreign:
      raise UsageError(f"{flag}: the folder holds {', '.join(foreign[:3])} besides "
                       f"{self.label} lingvo_lite wrote, and it never replaces files it did "
                       "not write; move them away, or name a new or empty folder")
    return _OURS

  def _recorded_schema(self) -> str | None:
    """The manifest's schema; None where there is no readable manifest of lingvo_lite's size
    (a FIFO would block the read, a huge file take minutes)."""
    manifest = os.path.join(os.fspath(self.path), MANIFEST)
    try:
      info = os.stat(manifest)
      if not stat.S_ISREG(info.st_mode) or info.st_size > _MANIFEST_LIMIT:
        return None
      with open(manifest, encoding="utf-8") as f:
        data = json.load(f)
    except (OSError, ValueError, RecursionError):
      return None
    value = data.get("schema") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def _remote_state(output: FolderOutput) -> str:
  """The same rules through epath (no listing of what is not there, no symlinks)."""
  if not output.path.exists():
    return _MISSING
  if not output.path.is_dir():
    raise UsageError(f"{output.flag}: exists and is not a folder; name a new or existing "
                     "folder")
  entries = sorted(p.name for p in output.path.iterdir())
  if not entries:
    return _EMPTY
  # A remote folder: the same rules, one message.
  try:
    recorded = json.loads((output.path / MANIFEST).read_text()).get("schema")
  except Exception:  # pylint: disable=broad-except
    recorded = None
  foreign = [name for name in entries if name not in output.files]
  if foreign or not str(recorded).startswith(f"lingvo_lite.{output.kind}/"):
    raise UsageError(f"{output.flag}: the folder holds files lingvo_lite did not write, which "
                     "are never overwritten; name a new or empty folder, or move them away")
  return _OURS


def check_folder(path: epath.Path, flag: str, kind: str, files: tuple[str, ...], label: str,
                 job_dir: epath.Path | None = None) -> FolderOutput:
  """The output folder at `path` (resolved), refused before anything runs when it cannot be
  this program's: inside a job's checkpoints, something lingvo_lite did not write (see
  FolderOutput.state), or a place where no folder can be created."""
  output = FolderOutput(path, flag, kind, files, label)
  refuse_inside_checkpoints(path, flag, job_dir)
  state = output.state()
  if paths.is_remote(str(path)):
    return output
  if state == _MISSING:
    check_creatable(path, flag, "name a folder you can write")
  else:
    # Written beside the folder, then renamed into place: its parent takes the new entries.
    problem = paths.creation_problem(os.path.dirname(_real(path)))
    if problem is not None:
      raise refusal(flag, problem, f"write beside {path}", "name a folder you can write")
  return output


def write_folder(output: FolderOutput, write: Callable[[epath.Path], None]) -> bool:
  """Writes `output`'s files with `write(folder)` into a new folder beside it, then renames
  that into place: a reader sees the old output whole or the new one whole, and a failed
  write leaves the old one (or nothing) as it was. Checks again, just before, that what is
  there may be replaced.

  Returns:
    Whether it replaced lingvo_lite's own earlier output.

  Raises:
    UsageError: what is there now is not replaceable (written meanwhile by someone else).
    OSError: a failed write, naming the file where it was to be (not in the staging folder).
  """
  if paths.is_remote(str(output.path)):
    state = output.state()
    output.path.mkdir(parents=True, exist_ok=True)
    write(output.path)
    return state == _OURS
  target = os.fspath(output.path)
  if os.path.islink(target):
    target = _real(target)  # The user's link stays; its folder gets the output.
  parent, name = os.path.split(target)
  with created_folders(epath.Path(parent)):
    stage = os.path.join(parent, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.partial")
    try:
      os.mkdir(stage)
      write(epath.Path(stage))
      return _rename_into_place(output, stage, target)
    except OSError as e:
      # The staging folder is a name nobody knows: a failure names the file at its place.
      moved = _at_final_place(e, stage, target)
      if moved is e:
        raise
      raise moved from e
    finally:
      if os.path.lexists(stage):
        shutil.rmtree(stage, ignore_errors=True)


def _at_final_place(error: OSError, stage: str, target: str) -> OSError:
  """`error` naming the file it failed on where that file was to be (under `target`) rather
  than in the staging folder `stage`; as it is when it names another path, or none."""
  name = error.filename
  if not isinstance(name, str) or not (name == stage or name.startswith(stage + os.sep)):
    return error
  return OSError(error.errno, error.strerror, os.path.join(target, os.path.relpath(name, stage)))


def _rename_into_place(output: FolderOutput, stage: str, target: str) -> bool:
  for _ in range(10):  # Another writer of the same folder (two compiles) may come between.
    state = output.state()
    if state != _OURS:
      try:
        os.rename(stage, target)  # Replaces an empty folder; refuses a non-empty one.
        return False
      except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
          raise
        continue
    old = f"{stage[:-len('.partial')]}.old"
    try:
      os.rename(target, old)
    except FileNotFoundError:
      continue
    try:
      os.rename(stage, target)
    except OSError:
      with contextlib.suppress(OSError):
        os.rename(old, target)  # Put the earlier output back.
      raise
    shutil.rmtree(old, ignore_errors=True)
    return True
  raise FileExistsError(errno.EEXIST, "written meanwhile by another process", target)
