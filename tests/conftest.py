"""What every test file shares: the caches of one test run, and the fixtures around them.

Each Bazel test target is a process of its own, so what one file compiles or trains another
would otherwise compile or train again. Two caches, in one folder per machine
(tests/trained_jobs.py says where; bin/setup.sh makes it writable inside Bazel's sandbox),
keep that work once:

  - JAX's persistent compilation cache, `<cache>/jax`, for every test process and for the
    `python -m lingvo_lite` processes tests start (they inherit JAX_COMPILATION_CACHE_DIR). A
    run given its own --compilation_cache_dir uses that folder instead, and one given
    --compilation_cache_dir= (or a program without the cache, compile) none: the executor
    sets both before its program compiles, in this process as in a new one, and the shared
    folder comes back after the test.
  - Trained jobs, `<cache>/jobs` (tests/trained_jobs.py): the `prepare_workdir` fixture.

A test never depends on either being warm: a miss compiles or trains, as on a fresh machine.
This module imports only the standard library and pytest at load time, so a target that needs
neither JAX nor the project pays nothing for it.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time
import warnings
from typing import Sequence

import pytest

from tests import trained_jobs

JAX_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
JAX_CACHE_DAYS = 14
# Every compile is worth keeping: the suite's programs are small, and each one is compiled by
# several targets on 2 cores.
JAX_MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
# JAX writes an entry in place: a process that reads it while another writes it sees a
# truncated entry, warns with this message and compiles instead. Harmless, but the warning
# would land on the stderr that tests hold to one line.
_TRUNCATED_ENTRY = "Error reading persistent compilation cache entry"


def _shared_jax_cache() -> str | None:
  """The shared folder for JAX's compiled programs, or None if it cannot be made (the run
  then compiles everything, as without it)."""
  folder = trained_jobs.cache_dir() / "jax"
  try:
    folder.mkdir(parents=True, exist_ok=True)
  except OSError:
    return None
  return str(folder)


def _prune(folder: str) -> None:
  """Deletes compiled programs (and kept results) written more than JAX_CACHE_DAYS ago, at
  most once a day (JAX keeps every program it is given, and each change of the code makes new
  ones). A program still in use is compiled again once."""
  stamp = pathlib.Path(folder) / ".pruned"
  now = time.time()
  try:
    if now - stamp.stat().st_mtime < 86400:
      return
  except OSError:
    pass
  stamp.touch()
  # JAX's programs, and one level down what lingvo_lite keeps beside them
  # (runtime/kept_results.py: compile analyses, the matmul peak).
  entries = list(os.scandir(folder))
  for entry in list(entries):
    if entry.is_dir(follow_symlinks=False):
      try:
        entries += os.scandir(entry.path)
      except OSError:
        pass
  for entry in entries:
    try:
      if entry.is_file() and now - entry.stat().st_mtime > JAX_CACHE_DAYS * 86400:
        os.unlink(entry.path)
    except OSError:
      pass  # Another process pruned it first.


def _use_shared_jax_cache() -> None:
  folder = _shared_jax_cache()
  if folder is None or os.environ.get(JAX_CACHE_ENV):
    return  # No folder, or the person running the tests chose one.
  _prune(folder)
  os.environ[JAX_CACHE_ENV] = folder
  os.environ.setdefault(JAX_MIN_COMPILE_TIME_ENV, "0")
  ignore = f"ignore:{_TRUNCATED_ENTRY}"
  os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                        ignore]))
  warnings.filterwarnings("ignore", message=_TRUNCATED_ENTRY)
  if "jax" in sys.modules:  # Imported by a plugin before this file: set what it has read.
    _jax_config().update("jax_compilation_cache_dir", folder)
    _jax_config().update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _jax_config():
  import jax  # pylint: disable=import-outside-toplevel
  return jax.config


_use_shared_jax_cache()

# Set by bench/tpu_test_parts.py on a TPU machine, whose chip takes one process at a time.
CHILDREN_ON_CPU_ENV = "LINGVO_LITE_TEST_CHILDREN_ON_CPU"


def _children_on_the_cpu() -> None:
  """Where asked (CHILDREN_ON_CPU_ENV=1), the processes a test starts (`python -m lingvo_lite`
  as a user types it) run on the CPU: this process holds the chip, and a second one that
  asks for it fails ("The TPU is already in use"). JAX reads JAX_PLATFORMS when it is
  imported, so this process imports it first and keeps the platforms it was given; the
  children inherit JAX_PLATFORMS=cpu from its environment."""
  if os.environ.get(CHILDREN_ON_CPU_ENV) != "1":
    return
  import jax  # pylint: disable=import-outside-toplevel,unused-import
  os.environ["JAX_PLATFORMS"] = "cpu"
  # JAX warns at import on a TPU VM without transparent hugepages, whatever the platform the
  # process then asks for: a line on every child's stderr that is the machine's, not the
  # program's (tests hold a refusal to its one line).
  os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [
      os.environ.get("PYTHONWARNINGS"), "ignore::UserWarning:jax._src.cloud_tpu_init"]))


_children_on_the_cpu()


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  """Where the children run on the CPU and this process on a chip (CHILDREN_ON_CPU_ENV), a
  test marked `compares_a_child` would compare two devices' floating point, not what it is
  about (a killed child's run resumed here against an uninterrupted one): skipped, saying so."""
  if os.environ.get(CHILDREN_ON_CPU_ENV) != "1":
    return
  import jax  # pylint: disable=import-outside-toplevel
  if jax.default_backend() == "cpu":
    return
  skip = pytest.mark.skip(reason=(
      f"compares a child's run (on the CPU: the {jax.default_backend()} takes one process) "
      "with this process's (on the chip): two devices' rounding, not the resume it checks"))
  for item in items:
    if item.get_closest_marker("compares_a_child"):
      item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_jax_cache_on_each_folder_change():
  """As in a process of its own, a run that sets --compilation_cache_dir gets that folder.

  JAX opens its persistent cache once, at the first compile, and ignores later changes of
  folder; the executor sets the flag's folder before compiling, which in a new process is
  before JAX's first compile, but in a test process usually after it. So while a test runs,
  a change of folder resets JAX's cache (it opens the new folder at the next compile), and
  the shared folder comes back after the test.
  """
  if "jax" not in sys.modules:
    yield
    return
  from jax._src import compilation_cache, config  # pylint: disable=import-outside-toplevel
  state = config.compilation_cache_dir
  before = state.value
  hook = getattr(state, "_update_global_hook", "missing")
  if hook == "missing":  # Another JAX: leave it as it is.
    yield
    return
  state._update_global_hook = lambda value: compilation_cache.reset_cache()  # pylint: disable=protected-access
  enabled = config.enable_compilation_cache.value  # A run without the cache turns it off.
  try:
    yield
  finally:
    if state.value != before:
      _jax_config().update("jax_compilation_cache_dir", before)
    state._update_global_hook = hook  # pylint: disable=protected-access
    if config.enable_compilation_cache.value != enabled:
      _jax_config().update("jax_enable_compilation_cache", enabled)
      compilation_cache.reset_cache()


# ----------------------------------------------------------------------------- trained jobs


@pytest.fixture(scope="session")
def prepare_workdir():
  """A function `(commands, destination) -> results`: copies into `destination` (made if
  missing) the working directory that `commands` leave, run in order in an empty one as
  `lingvo_lite.testing.run_cli` runs them, and returns their results (each exited 0).

  The working directory comes from the shared cache (tests/trained_jobs.py): made once per
  machine and code version, by whichever test process asks first, then copied. A test that
  asks for one depends (in its BUILD target) on what the commands run.
  """
  def prepare(commands: Sequence[Sequence[str]], destination: pathlib.Path
              ) -> tuple[trained_jobs.Result, ...]:
    prepared = trained_jobs.prepare(commands)
    trained_jobs.copy_workdir(prepared, destination)
    return prepared.results
  return prepare


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory, prepare_workdir) -> pathlib.Path:
  """A working directory of the module's own holding a copy of the shared tiny trained job at
  `trained_jobs.TINY_JOB` (what `trained_jobs.TINY_TRAIN` trains)."""
  workdir = tmp_path_factory.mktemp("tiny_job")
  prepare_workdir([trained_jobs.TINY_TRAIN], workdir)
  return workdir
