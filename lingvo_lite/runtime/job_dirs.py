"""What a job directory must look like before a program reads or writes it.

A training run creates its job dir and writes `config.*`, `checkpoints/`, metrics and
summaries there; eval writes under `JOB/eval/`; other programs only read, or write a folder
of their own. Each program declares what it does with the job dir (`JobFiles`, its module's
`JOB_FILES`), and `check` knows nothing else about it. A path that cannot serve would
otherwise fail late: after compiling, after the evaluation, inside orbax's background save
thread, in TensorBoard's writer, or after minutes of orbax time-outs. These checks run first,
so the user gets one line before any device time, and nothing on disk changes.

Every path the program will create or write is checked, not only the job dir's top level (a
`summaries/train` or `eval/summaries` that is a file fails only once the work is done), and
so are: symlinks that lead nowhere (a missing target or a loop), names and paths longer than
the file system takes, and folders that look writable but are not. `access()` answers yes to
root in `/proc`, so where a folder will be created, an empty temporary folder is created and
removed there first: the one change a check makes, undone at once.

Local checks use `os` directly (lstat, pathconf, access, mkdir), which etils.epath does not
offer. A remote job dir (`gs://...`) gets the kind checks through epath, and an error on the
way to it (no network, no credentials, an unsupported file system) is one line.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat

from etils import epath

from lingvo_lite import input_files, outputs, paths
from lingvo_lite.runtime import tensorflow_import
from lingvo_lite.errors import UsageError

FOLDER, FILE = "folder", "file"
# What every program may read, relative to the job dir: checked for its kind where present.
# `stacks/` too: every program with a config writes its stack dumps there on SIGUSR1
# (stack_dumps.py).
# The config a job records (config/files.py writes them; named here, a lower layer, too).
CONFIG_JSON, CONFIG_TXT = "config.json", "config.txt"
_READ = ((CONFIG_JSON, FILE), ("checkpoints", FOLDER), ("stacks", FOLDER))
Member = tuple[str, str]  # (path relative to the job dir, FOLDER or FILE)


@dataclasses.dataclass(frozen=True)
class JobFiles:
  """What a program does with a job dir: what `check` makes sure it can do.

  Attributes:
    creates: It writes into the job dir itself and creates it where missing (train,
      compile); a program that does not needs an existing job dir.
    written: What it creates or writes, parents before children: checked for its kind where
      present and for being writable, and where missing, its nearest existing folder is
      tested.
    kind_only: What it may write, but checks it can write itself, where it decides to (decode
      writes JOB/decode/ only when its completions go there): checked for its kind only.
    eval_sets_under: Where it writes each eval set's rows and summaries, relative to the job
      dir ("" for the job dir itself, "eval/"); None where it writes none. The sets are named
      by the built config, so the executor checks again once it has them.
    when_profiling: What it writes when the config asks for a profiler trace
      (train.profile_start_step >= 0; known once the config is built, as the eval sets).
    records_config: It runs on a job dir that is not there yet (from --exp), creating it and
      recording its config (config.json, config.txt) where the job dir has none; a job dir
      with a config is only read (decode, eval: a read-only job dir still serves them).
  """

  creates: bool = False
  written: tuple[Member, ...] = ()
  kind_only: tuple[Member, ...] = ()
  eval_sets_under: str | None = None
  when_profiling: tuple[Member, ...] = ()
  records_config: bool = False

  @property
  def depend_on_config(self) -> bool:
    """What it writes depends on the built config (its eval sets, its profiling)."""
    return self.eval_sets_under is not None or bool(self.when_profiling)


# Bytes below the job dir of the deepest file a writing program creates: orbax's temporary step
# folder and data files (`checkpoints/12.orbax-checkpoint-tmp-1700000000123/default/
# ocdbt.process_0/d/<32 hex>`, about 110) or a TensorBoard event file, whose name holds the
# host name (up to 64 bytes, about 150 in all).
_DEEPEST_WRITE = 160
_MISSING, _DANGLING, _LOOP = "missing", "a symlink whose target does not exist", "a symlink loop"


def check(job_dir: epath.Path, files: JobFiles, as_written: str, profile: bool = False,
          eval_sets: tuple[str, ...] = ()) -> None:
  """Raises UsageError when `job_dir` cannot serve a program that does `files` with it.

  Args:
    job_dir: The resolved path.
    files: What the program about to run does with it (its module's JOB_FILES).
    as_written: The flag's value as the user gave it, for the message.
    profile: The run writes a profiler trace (`files.when_profiling`); known once the config
      is built, so the executor checks again then.
    eval_sets: The names of the eval sets, whose files the program writes under
      `files.eval_sets_under` (known once the config is built, as `profile`).
  """
  flag = f"--job_log_dir={as_written}"
  written = list(files.written)
  if profile:
    written.extend(files.when_profiling)
  root = files.eval_sets_under
  for name in eval_sets if root is not None else ():
    written += [(f"{root}summaries/eval_{name}", FOLDER), (f"{root}eval_{name}.jsonl", FILE)]
  members = list(dict.fromkeys([*_READ, *files.kind_only, *written]))  # Each once.
  if paths.is_remote(str(job_dir)):
    _check_remote(job_dir, files.creates or files.records_config, flag, members)
  else:
    _check_local(os.fspath(job_dir), files.creates, flag, members, {name for name, _ in written},
                 files.records_config)


# ----------------------------------------------------------------------------- local


def _check_local(job_dir: str, creates: bool, flag: str, members: list[Member],
                 written: set[str], records_config: bool = False) -> None:
  ancestor = _nearest_existing(job_dir)
  _check_lengths(job_dir, ancestor, flag, _DEEPEST_WRITE if written else 0)
  kind = _kind(job_dir, flag)
  if kind in (_DANGLING, _LOOP):
    raise _bad_link(job_dir, kind, flag)
  if kind == FILE:
    raise UsageError(f"{flag}: is a file, not a folder; give the job's folder (training "
                     "creates it if missing)")
  if kind == _MISSING:
    if not (creates or records_config):
      raise UsageError(f"{flag}: no such folder; give the --job_log_dir of a training run")
    _check_creatable(ancestor, flag)
    return
  # A config to record (programs.record_config_where_missing: a job dir with neither).
  if (records_config and not creates
      and _kind(os.path.join(job_dir, CONFIG_JSON), flag) != FILE
      and _kind(os.path.join(job_dir, "checkpoints"), flag) == _MISSING):
    written = written | {CONFIG_JSON, CONFIG_TXT}
    members = [*members, (CONFIG_JSON, FILE), (CONFIG_TXT, FILE)]
  if creates and not os.access(job_dir, os.W_OK | os.X_OK):
    raise _not_writable(job_dir, flag, "write in")
  to_create = []  # The nearest existing folder of each missing path that will be written.
  for name, wanted in members:
    member = os.path.join(job_dir, name)
    kind = _kind(member, flag)
    if kind in (_DANGLING, _LOOP):
      raise _bad_link(member, kind, flag)
    if kind == _MISSING:
      if name in written:
        to_create.append(_nearest_existing(member))
      continue
    special = input_files.kind_of(member) if kind == FILE else None
    if special is not None:  # A FIFO as config.json: reading it would wait for ever.
      what = "regular file" if wanted == FILE else wanted
      raise UsageError(f"{flag}: {member} is {special}, not a {what}; move it away, or use "
                       "another --job_log_dir")
    if kind != wanted:
      raise UsageError(f"{flag}: {member} is a {kind}, not a {wanted}; move it away, or use "
                       "another --job_log_dir")
    if name in written and not os.access(member, os.W_OK | (os.X_OK if kind == FOLDER else 0)):
      raise _not_writable(member, flag, "write")
  for folder in dict.fromkeys(to_create):
    _check_creatable(folder, flag)


def _kind(path: str, flag: str) -> str:
  """FOLDER, FILE (anything else that is not a folder), _MISSING, _DANGLING or _LOOP."""
  try:
    mode = os.stat(path).st_mode
  except (FileNotFoundError, NotADirectoryError):
    # NotADirectoryError: a file on the way, which the check of that file reports.
    return _DANGLING if os.path.islink(path) else _MISSING
  except OSError as e:
    if e.errno == errno.ELOOP:
      return _LOOP
    raise UsageError(f"{flag}: cannot look at {path} ({e.strerror or e}); fix its "
                     "permissions or use another --job_log_dir") from None
  return FOLDER if stat.S_ISDIR(mode) else FILE


def _bad_link(path: str, kind: str, flag: str) -> UsageError:
  target = os.readlink(path)
  return UsageError(f"{flag}: {path} is {kind} (-> {target}); create what it should point "
                    "to, remove the link, or use another --job_log_dir")


def _nearest_existing(path: str) -> str:
  """`path` or its nearest ancestor that is there at all (a broken symlink counts)."""
  while not os.path.lexists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


def _check_lengths(job_dir: str, ancestor: str, flag: str, deepest: int) -> None:
  """Each name and the whole path (with what the program writes below it) within the limits of
  the file system they are on, which would fail with ENAMETOOLONG only at the first write."""
  name_max = _pathconf(ancestor, "PC_NAME_MAX")
  path_max = _pathconf(ancestor, "PC_PATH_MAX")
  if name_max:
    for name in os.fsencode(job_dir).split(b"/"):
      if len(name) > name_max:
        shown = name[:24].decode("utf-8", "backslashreplace")
        raise UsageError(f"{flag}: the name {shown}... is {len(name)} bytes long, and this "
                         f"file system allows {name_max}; use a shorter name")
  length = len(os.fsencode(job_dir)) + deepest
  if path_max and length >= path_max:  # PATH_MAX counts the terminating NUL.
    below = f" with the {deepest} bytes a run writes below it" if deepest else ""
    raise UsageError(f"{flag}: the path is {len(os.fsencode(job_dir))} bytes long{below}, and "
                     f"this system allows paths of {path_max - 1}; use a shorter path")


def _pathconf(path: str, name: str) -> int | None:
  try:
    value = os.pathconf(path, name)
  except (OSError, ValueError):
    return None  # The limit is unknown here (or there is none): nothing to check.
  return value if value and value > 0 else None


def _check_creatable(folder: str, flag: str) -> None:
  """Folders can be created in `folder`, the nearest existing ancestor of what will be."""
  kind = _kind(folder, flag)
  if kind in (_DANGLING, _LOOP):
    raise _bad_link(folder, kind, flag)
  if kind != FOLDER:
    raise UsageError(f"{flag}: {folder} is a file, so the job folder cannot be created "
                     "under it; choose another --job_log_dir")
  if not os.access(folder, os.W_OK | os.X_OK):
    raise _not_writable(folder, flag, "create folders in")
  problem = paths.creation_problem(folder)  # /proc, a full disk, an ACL: what access() passes.
  if problem is not None:
    raise outputs.refusal(flag, problem, f"create folders in {folder}",
                          "choose another --job_log_dir")


def _not_writable(path: str, flag: str, action: str) -> UsageError:
  """What access() refused, by its cause: a read-only mount (no chmod helps), or permissions."""
  if paths.is_read_only_mount(path):
    return UsageError(f"{flag}: {path} is on a read-only file system (EROFS); remount it "
                      "read-write, or use another --job_log_dir")
  return UsageError(f"{flag}: this user may not {action} {path}; fix its permissions or use "
                    "another --job_log_dir")


# ----------------------------------------------------------------------------- remote


def _check_remote(job_dir: epath.Path, creates: bool, flag: str,
                  members: list[Member]) -> None:
  """The kind checks through epath; a failure to reach the store is one line."""
  try:
    # Where TensorFlow is installed, epath reaches gs:// and s3:// through tf.io.gfile:
    # imported here first, its start-up lines on stderr stay out of the one-line contract.
    tensorflow_import.import_tensorflow()
  except ImportError:
    pass  # epath uses fsspec instead.
  try:
    exists = job_dir.exists()
    is_dir = exists and job_dir.is_dir()
  except Exception as e:  # pylint: disable=broad-except
    # Each file system backend raises its own types (gfile, fsspec, HTTP clients).
    raise UsageError(f"{flag}: cannot be reached ({_one_line(e)}); check the URL, and this "
                     "machine's network and credentials for it") from None
  if exists and not is_dir:
    raise UsageError(f"{flag}: is a file, not a folder; give the job's folder (training "
                     "creates it if missing)")
  if not exists:
    if not creates:
      raise UsageError(f"{flag}: no such folder; give the --job_log_dir of a training run")
    return
  for name, wanted in members:
    member = job_dir / name
    try:
      if not member.exists():
        continue
      kind = FOLDER if member.is_dir() else FILE
    except Exception as e:  # pylint: disable=broad-except
      raise UsageError(f"{flag}: cannot read {member} ({_one_line(e)}); check this "
                       "machine's credentials for it") from None
    if kind != wanted:
      raise UsageError(f"{flag}: {member} is a {kind}, not a {wanted}; move it away, or use "
                       "another --job_log_dir")


def _one_line(error: BaseException) -> str:
  """An exception as one short line: storage clients' messages span lines and name URLs."""
  text = " ".join(str(error).split())
  if len(text) > 300:
    text = f"{text[:150]} ... {text[-140:]}"
  return f"{type(error).__name__}: {text}" if text else type(error).__name__
