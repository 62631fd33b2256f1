"""A folder a program writes whole, with a manifest naming lingvo_lite and the kind of output
(a compiled step, an export): checked before anything runs (`check_folder`: never inside a
job's checkpoints, never over files lingvo_lite did not write, never where no folder can be
created), then written beside it and renamed into place (`write_folder`), so a reader sees the
old output whole or the new one whole. The rules are outputs.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
import stat
from typing import Callable

from etils import epath

from lingvo_lite import input_files, paths
from lingvo_lite.errors import UsageError, os_error_text, shown
from lingvo_lite.outputs import (MANIFEST, check_creatable, created_folders, real,
                                 refuse_inside_checkpoints, refusal)

# Larger than any manifest lingvo_lite writes (a compiled step's is a few KiB).
_MANIFEST_LIMIT = 16 << 20

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
        data = input_files.json_value(f.read())
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
    recorded = input_files.json_value((output.path / MANIFEST).read_text()).get("schema")
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
    problem = paths.creation_problem(os.path.dirname(real(path)))
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
    target = real(target)  # The user's link stays; its folder gets the output.
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
