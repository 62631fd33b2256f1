"""Trained jobs shared by every test process: each is made once per machine and code version,
then copied by whoever needs it.

Each Bazel test target is its own process, so a job trained in a module fixture is trained again
by every file that wants one. Here a job is what a list of command lines leaves in an empty
working directory (each run as `lingvo_lite.testing.run_cli` runs it, in one child process, in
order: train, then perhaps eval, decode, ...), kept in a cache folder under a key made of:

  - the command lines and the interpreter (its path names the venv, whose folder name hashes
    requirements.lock; its version), and the environment variables that change what a run
    does (XLA_FLAGS, JAX_PLATFORMS);
  - the code that made it: every module under lingvo_lite/, tasks/ and experiments/ that the
    child imported, each file's SHA-256 recorded in the entry when it was made.

An entry whose recorded files no longer hash the same is stale: the next request makes a new
entry (the old one is deleted once unused for a while). A list of commands that extends another's
starts from a copy of that entry and runs only the commands after it, and the first command of
a list gets an entry of its own: the tiny job one file trains is the start of another file's
longer list. Entries are made in a temporary folder
under a lock (two targets may ask at once) and renamed into place, so they are complete or
absent; after that they are read-only by contract: `copy_workdir` gives each test its own copy
to write into, and every lookup checks the entry's digest, so an entry someone wrote into is
thrown away and made again rather than served.

The cache folder is $LINGVO_LITE_TEST_CACHE_DIR (bin/setup.sh points Bazel's tests at one folder
per machine and makes it writable inside the sandbox), else ~/.cache/lingvo_lite/test_cache.
This module uses only the standard library: the commands run in a child process, so importing
it (tests/conftest.py does, in every test target) pulls in no dependency.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Iterator, Sequence

# The tiny trained job that tests reading a job start from (alone, or as the first command of
# a longer list): PyCodeTiny under the tiny fiddler at runs/tiny, 20 steps of a quick rise
# (so its samples are not uniform noise), evaluated and checkpointed at steps 10 and 20 (both
# kept). Every file that starts from it shares one training per machine and code version.
TINY_JOB = "runs/tiny"
TINY_TRAIN = ("--exp=PyCodeTiny", "--fiddler=tiny", "--fdl.train.steps=20",
              "--fdl.train.eval_every_steps=10", "--fdl.checkpoint.every_steps=10",
              "--fdl.checkpoint.max_to_keep=None", "--fdl.optimizer.warmup_steps=2",
              "--fdl.optimizer.peak_learning_rate=1e-2",
              f"--job_log_dir={TINY_JOB}")

CACHE_ENV = "LINGVO_LITE_TEST_CACHE_DIR"
# Entries unused for this long are deleted when another entry of the cache is made.
UNUSED_DAYS = 7
TIMEOUT_S = 900
# The packages whose modules make up the code key (the project's own code; the third-party
# packages are keyed by the interpreter's path and version).
CODE_ROOTS = ("lingvo_lite", "tasks", "experiments")
# Environment variables that change what a run does, and so are part of the key.
KEYED_ENV = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_ENABLE_X64")

# The child: runs each command line of argv[3] (JSON) in order with lingvo_lite.testing.run_cli,
# stopping at the first that fails; writes their results and the project modules it imported
# (paths relative to the source root) to argv[2].
_CHILD = r"""
import dataclasses, json, os, sys
root, out, commands = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
from lingvo_lite import testing
results = []
for args in commands:
  results.append(dataclasses.asdict(testing.run_cli(args)))
  if results[-1]["code"] != 0:
    break
files = set()
for module in list(sys.modules.values()):
  path = os.path.abspath(getattr(module, "__file__", None) or "")
  if path.startswith(root + os.sep):
    files.add(os.path.relpath(path, root))
with open(out, "w") as f:
  json.dump({"results": results, "modules": sorted(files)}, f)
"""


def source_root() -> pathlib.Path:
  """The repository root this file was loaded from: the checkout under plain pytest, the
  workspace folder of the test's runfiles under Bazel (symlinks are not followed, so only the
  files the target depends on are seen)."""
  return pathlib.Path(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cache_dir() -> pathlib.Path:
  """The folder that holds the shared jobs and JAX's compiled programs (see the module doc)."""
  folder = os.environ.get(CACHE_ENV)
  if not folder:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    folder = os.path.join(base, "lingvo_lite", "test_cache")
  return pathlib.Path(folder)


@dataclasses.dataclass(frozen=True)
class Result:
  """One command's run, as lingvo_lite.testing.CliResult (which this module cannot import)."""
  code: int
  stdout: str
  stderr: str


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A cache entry: `workdir` is what the commands left (read-only: copy it with
  `copy_workdir` before running anything in it); `results` are their runs, in order, each
  with exit code 0."""
  workdir: pathlib.Path
  results: tuple[Result, ...]


def prepare(commands: Sequence[Sequence[str]], root: pathlib.Path | None = None,
            cache: pathlib.Path | None = None) -> Prepared:
  """The working directory `commands` leave, run now unless an entry made by the same
  commands and the same code exists.

  Args:
    commands: Command lines (without `python -m lingvo_lite`), with relative job dirs: they
      run in an empty working directory, as a user in a fresh folder runs them.
    root: The source tree to run and key (default: the one this file came from).
    cache: The cache folder (default: `cache_dir()`).

  Raises:
    AssertionError: a command exited non-zero (its stderr's tail in the message); nothing is
      kept, so the next request tries again.
  """
  root = root or source_root()
  jobs = (cache or cache_dir()) / "jobs"
  jobs.mkdir(parents=True, exist_ok=True)
  commands = [list(command) for command in commands]
  name = _command_key(commands)
  found = _lookup(jobs, name, root)
  if found is not None:
    return found
  if len(commands) > 1:
    # The first command (a training, usually) gets an entry of its own, for the other lists
    # that start with it; this list then starts from a copy of it (or of a longer prefix).
    prepare(commands[:1], root, cache)
  with _locked(jobs / f"{name}.lock"):
    found = _lookup(jobs, name, root)  # Another process may have made it while we waited.
    if found is not None:
      return found
    _prune(jobs)
    return _make(jobs, name, commands, root)


def copy_workdir(prepared: Prepared, destination: pathlib.Path) -> pathlib.Path:
  """Copies the entry's working directory into `destination` (made if missing; the job dirs
  keep their relative paths, so their configs and the test's command lines agree)."""
  destination = pathlib.Path(destination)
  shutil.copytree(prepared.workdir, destination, symlinks=True, dirs_exist_ok=True)
  return destination


def tree_digest(root: pathlib.Path) -> str:
  """SHA-256 over every path and file content under `root` (a job dir before and after a run
  that must not touch it, too)."""
  digest = hashlib.sha256()
  for directory, subdirectories, files in os.walk(root):
    subdirectories.sort()
    for name in sorted(files) + sorted(subdirectories):
      path = os.path.join(directory, name)
      digest.update(os.path.relpath(path, root).encode() + b"\0")
      if os.path.isfile(path):
        with open(path, "rb") as f:
          digest.update(f.read())
  return digest.hexdigest()


# ----------------------------------------------------------------------------- the entries


def _command_key(commands: Sequence[Sequence[str]]) -> str:
  """The key part that does not need the code: command lines, interpreter, environment."""
  environment = {name: os.environ.get(name) for name in KEYED_ENV}
  text = json.dumps([commands, os.path.realpath(sys.executable), sys.version, environment])
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def _file_hash(path: pathlib.Path) -> str | None:
  try:
    return hashlib.sha256(path.read_bytes()).hexdigest()
  except OSError:
    return None


def _lookup(jobs: pathlib.Path, name: str, root: pathlib.Path) -> Prepared | None:
  """A complete entry for `name` whose recorded code matches `root`'s, or None."""
  found = _lookup_entry(jobs, name, root)
  return None if found is None else _prepared(*found)


def _prepared(entry: pathlib.Path, meta: dict) -> Prepared:
  return Prepared(entry / "work", tuple(Result(**r) for r in meta["results"]))


def _lookup_entry(jobs: pathlib.Path, name: str,
                  root: pathlib.Path) -> tuple[pathlib.Path, dict] | None:
  """(folder, record) of a complete entry for `name` whose recorded code matches `root`'s, or
  None. An entry whose files changed since it was made is deleted (it was written into)."""
  for entry in sorted(jobs.glob(f"{name}-*")):
    try:
      meta = json.loads((entry / "entry.json").read_text())
    except (OSError, ValueError):
      continue  # Being deleted by another process.
    if any(_file_hash(root / relative) != digest for relative, digest in meta["code"].items()):
      continue  # Made by other code: stale for this tree (another checkout may still use it).
    if tree_digest(entry / "work") != meta["digest"]:
      print(f"trained_jobs: {entry} was written into after it was made; making it again",
            file=sys.stderr)
      _remove(entry)
      continue
    (entry / "last_used").write_text(str(time.time()))
    return entry, meta
  return None


def _longest_prefix(jobs: pathlib.Path, commands: list[list[str]], root: pathlib.Path
                    ) -> tuple[int, pathlib.Path | None, dict]:
  """(k, folder, record) of the entry of the longest proper prefix `commands[:k]` that is in
  the cache, or (0, None, {}) if none is."""
  for k in range(len(commands) - 1, 0, -1):
    found = _lookup_entry(jobs, _command_key(commands[:k]), root)
    if found is not None:
      return (k, *found)
  return 0, None, {}


def _make(jobs: pathlib.Path, name: str, commands: list[list[str]],
          root: pathlib.Path) -> Prepared:
  making = pathlib.Path(tempfile.mkdtemp(prefix=f".making-{name}-", dir=jobs))
  try:
    work = making / "work"
    start, prefix, prefix_meta = _longest_prefix(jobs, commands, root)
    if prefix is None:
      work.mkdir()
    else:
      shutil.copytree(prefix / "work", work, symlinks=True)
    out = making / "child.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), str(out), json.dumps(commands[start:])],
        cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert completed.returncode == 0 and out.is_file(), (
        f"the child that runs the commands failed (exit {completed.returncode}): "
        f"{completed.stderr[-3000:]}")
    child = json.loads(out.read_text())
    for command, result in zip(commands[start:], child["results"]):
      if result["code"] != 0:
        _skip_where_apache_beam_is_missing(result["stderr"])
      assert result["code"] == 0, (
          f"{' '.join(command)}: exit {result['code']}\n{result['stderr'][-3000:]}")
    code = {relative: _file_hash(root / relative) for relative in child["modules"]
            if relative.split(os.sep)[0] in CODE_ROOTS}
    # An empty key would match any code: the child must have run this tree's executor.
    assert os.path.join("lingvo_lite", "executor.py") in code, (
        f"the commands imported no lingvo_lite module from {root}: {child['modules'][:10]}")
    code.update(prefix_meta.get("code", {}))  # The prefix's commands ran that code.
    code_key = hashlib.sha256(json.dumps(code, sort_keys=True).encode()).hexdigest()[:16]
    meta = {"commands": commands, "code": code,
            "results": prefix_meta.get("results", []) + child["results"],
            "from_prefix": prefix.name if prefix else None,
            "digest": tree_digest(work), "made": time.time()}
    (making / "entry.json").write_text(json.dumps(meta, indent=1))
    (making / "last_used").write_text(str(time.time()))
    entry = jobs / f"{name}-{code_key}"
    if entry.exists():  # The same code under another source path made it first.
      _remove(making)
      meta = json.loads((entry / "entry.json").read_text())
    else:
      os.rename(making, entry)
    return _prepared(entry, meta)
  except BaseException:
    _remove(making)
    raise


def _skip_where_apache_beam_is_missing(stderr: str) -> None:
  """A job's data comes from a token store built by an Apache Beam pipeline on its first use;
  a machine without Beam (the lent TPU machine: bench/tpu_test_parts.py) cannot make the job,
  and every test that wants it is skipped there, saying so. CI installs Beam from the lock,
  so there a failed job stays a failure."""
  missing = importlib.util.find_spec("apache_beam") is None
  if missing and "No module named 'apache_beam'" in stderr:
    import pytest  # pylint: disable=import-outside-toplevel  # Only in a test process.
    pytest.skip("this job's token store is built by Apache Beam, which this machine lacks")


def _prune(jobs: pathlib.Path) -> None:
  """Deletes entries unused for UNUSED_DAYS, and folders a killed process left half built or
  half deleted (names starting with '.', a day after they were last changed)."""
  now = time.time()
  for entry in jobs.iterdir():
    if not entry.is_dir():
      continue
    leftover = entry.name.startswith(".")
    try:
      changed = (entry if leftover else entry / "last_used").stat().st_mtime
    except OSError:
      continue
    if (now - changed) / 86400 > (1 if leftover else UNUSED_DAYS):
      if leftover:
        shutil.rmtree(entry, ignore_errors=True)
      else:
        _remove(entry)


def _remove(folder: pathlib.Path) -> None:
  """Deletes `folder`, first renaming it so that no lookup sees it half deleted."""
  doomed = folder.with_name(f".deleting-{folder.name}-{os.getpid()}")
  try:
    os.rename(folder, doomed)
  except OSError:
    return
  shutil.rmtree(doomed, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
  """An exclusive lock between processes (released when the process dies, too)."""
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)
