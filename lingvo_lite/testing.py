"""Helpers for tests: tiny setups, the CLI run in-process, job-dir digests, shaped batches,
working copies of the repository, a command run on a terminal that hangs up.

Importing this module defines no absl flags: the executor (the one module that defines them) is
imported only by the helpers that run it, so a test of a library, or a tool with flags of its
own, can use the tiny setups without the command line's flags in its `flags.FLAGS`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pathlib
import pty
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

import fiddle as fdl
import jax
import jax.numpy as jnp
from absl import flags

from lingvo_lite.config import building, fiddlers, overrides, registry
from lingvo_lite.experiment import Setup
from lingvo_lite.on_mesh.jitted import JittedSteps


def tiny_config(experiment: str, *sets: str, synthetic: bool = False) -> fdl.Config:
  """The registered experiment's config with the `tiny` fiddler (and `synthetic_data` if
  asked), then `path=value` sets, in that order."""
  cfg = registry.lookup(experiment).config()
  fiddlers.tiny(cfg)
  if synthetic:
    fiddlers.synthetic_data(cfg)
  overrides.apply(cfg, [overrides.set_directive(f"--fdl.{s}", s) for s in sets], None)
  return cfg


def synthetic_tiny_setup(experiment: str = "PyCodeTiny", *sets: str) -> Setup:
  """A tiny, validated Setup on synthetic data (no TensorFlow needed)."""
  return building.build(tiny_config(experiment, *sets, synthetic=True))

def assert_experiment_lowers(setup: Setup) -> Any:
  """Shapes the state and lowers the train step on the available devices; returns lowered."""
  return JittedSteps(setup).lower_train_step()

@dataclasses.dataclass(frozen=True)
class CliResult:
  code: int
  stdout: str
  stderr: str

def run_cli(args: Sequence[str]) -> CliResult:
  """Runs the executor in this process, as `python -m lingvo_lite ARGS` would.

  Sharing the process saves the ~6 s import of the stack per case; flags are reset first.
  """
  from lingvo_lite import executor  # pylint: disable=import-outside-toplevel  # Defines flags.
  flags.FLAGS.unparse_flags()
  stdout, stderr = io.StringIO(), io.StringIO()
  code = 0
  with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    try:
      # main gets the command line parse_flags parsed, as under absl's app.run.
      executor.main(executor.parse_flags(["lingvo_lite", *args]))
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else 1
  flags.FLAGS.unparse_flags()
  return CliResult(code, stdout.getvalue(), stderr.getvalue())

def run_process(args: Sequence[str], timeout: float = 600,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
  """Runs `python -m lingvo_lite ARGS` in a child process from the repository root, as a user
  runs it, its output captured as text: what a test needs a process of its own for (its
  device count, its exit, a command line exactly as typed)."""
  return subprocess.run([sys.executable, "-m", "lingvo_lite", *args], cwd=source_root(),
                        capture_output=True, text=True, timeout=timeout, check=False, env=env)


def kill_9_when(args: Sequence[str], ready: os.PathLike, timeout: float = 240) -> None:
  """Runs `python -m lingvo_lite ARGS` in a child process (from the repository root) and
  kills it with SIGKILL as soon as the path `ready` exists (a checkpoint step's folder).

  Raises:
    AssertionError: `ready` did not appear within `timeout` seconds.
  """
  root = str(source_root())
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get(
      "PYTHONPATH")])))
  process = subprocess.Popen([sys.executable, "-m", "lingvo_lite", *args], cwd=root, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + timeout
    while time.time() < deadline and not os.path.isdir(ready):
      time.sleep(0.05)
    assert os.path.isdir(ready), f"no {ready} within {timeout} s"
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
  finally:
    if process.poll() is None:
      process.kill()


def override_directives(args: Sequence[str]) -> list[overrides.Directive]:
  """The override directives `python -m lingvo_lite ARGS` would apply, in their order."""
  from lingvo_lite import executor  # pylint: disable=import-outside-toplevel  # Defines flags.
  flags.FLAGS.unparse_flags()
  try:
    executor.parse_flags(["lingvo_lite", *args])
    return list(executor.override_log().directives)
  finally:
    flags.FLAGS.unparse_flags()

# What a fresh clone needs to run the README's commands (bin/demo.sh, `python -m lingvo_lite`,
# bench/step_bench.py). Under `bazel test` each of these must be in the test's runfiles: the
# packages through deps, the rest through `data` (//:readme, //:requirements_lock, //bin:scripts,
# //bench:files).
WORKING_COPY_ENTRIES = ("README.md", "pyproject.toml", "requirements.lock",
                        "requirements-nodeps.lock", "bin", "bench",
                        "experiments", "lingvo_lite", "tasks")

def source_root() -> pathlib.Path:
  """The repository root this module was imported from.

  In a checkout that is the checkout; under `bazel test` it is the workspace folder of the
  test's runfiles tree (`$TEST_SRCDIR/lingvo_lite`), which holds only declared deps and data.
  """
  return pathlib.Path(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def make_working_copy(destination: str | os.PathLike,
                      entries: Sequence[str] = WORKING_COPY_ENTRIES) -> pathlib.Path:
  """Copies the repository's `entries` into `destination` (created) and returns it.

  Tests run the CLI from inside such a copy with relative paths, as a user of a fresh clone
  does: nothing they write (runs/, .venv, .bazelrc.local) lands in the real checkout, and
  under Bazel the runfiles' symlinks become plain files that scripts can `cd` among.

  Raises:
    FileNotFoundError: an entry is missing from the source (under Bazel: not in the test's
      deps or data).
  """
  source, destination = source_root(), pathlib.Path(destination)
  destination.mkdir(parents=True, exist_ok=True)
  for entry in entries:
    path = source / entry
    if not path.exists():
      raise FileNotFoundError(
          f"{path}: not found; a working copy needs {', '.join(entries)} (under Bazel, "
          "add it to the test's deps or data)")
    if path.is_dir():
      # symlinks=False: copy what runfiles symlinks point at, not the links.
      shutil.copytree(path, destination / entry, symlinks=False,
                      ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
      shutil.copy2(path, destination / entry)
  return destination


class Terminal:
  """A Python command run on a terminal of its own (a pseudo-terminal), as a login shell runs
  one: the session leader of a new session whose controlling terminal it is. What the command
  writes is read as a terminal window shows it (`shown`); `hang_up` closes the terminal, as
  closing the window or losing the ssh session does: the kernel sends the session SIGHUP, and
  writes to the terminal fail (EIO).

  Args:
    argv: The command line after the interpreter (`["-m", "lingvo_lite", ...]`).
    **popen_kwargs: For subprocess.Popen (cwd, env).
  """

  # Runs ARGV[2:] as the leader of a new session whose controlling terminal is ARGV[1].
  _ON_IT = ("import os, sys; os.setsid(); fd = os.open(sys.argv[1], os.O_RDWR); "
            "[os.dup2(fd, n) for n in (0, 1, 2)]; os.close(fd); "
            "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")

  def __init__(self, argv: Sequence[str], **popen_kwargs):
    self._window, other_end = pty.openpty()
    name = os.ttyname(other_end)
    os.close(other_end)
    self.shown = bytearray()
    self._closing = threading.Event()
    self._closed = threading.Event()
    self.process = subprocess.Popen([sys.executable, "-c", self._ON_IT, name, *argv],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, **popen_kwargs)
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self) -> None:
    """Reads what the command writes until the terminal closes; this thread closes it, so no
    read meets a descriptor number reused meanwhile."""
    while not self._closing.is_set():
      if select.select([self._window], [], [], 0.01)[0]:
        try:
          self.shown.extend(os.read(self._window, 1 << 16))
        except OSError:  # No side open yet: the command has not opened it.
          time.sleep(0.01)
    os.close(self._window)
    self._closed.set()

  def wait_for(self, text: bytes, timeout: float = 120) -> None:
    """Returns once `text` is shown; AssertionError if the command exits or time runs out."""
    deadline = time.time() + timeout
    while text not in self.shown:
      assert self.process.poll() is None, (
          f"the command exited ({self.process.returncode}) before showing {text!r}: "
          f"{self.shown.decode(errors='replace')[-2000:]}")
      assert time.time() < deadline, f"{text!r} not shown within {timeout} s"
      time.sleep(0.005)

  def hang_up(self, timeout: float = 120) -> int:
    """Closes the terminal; returns the command's exit code once it ends."""
    self._closing.set()
    self._closed.wait(timeout=10)
    return self.process.wait(timeout=timeout)

  def __enter__(self) -> Terminal:
    return self

  def __exit__(self, *exc) -> None:
    if self.process.poll() is None:
      self.process.kill()
      self.process.wait(timeout=30)
    self._closing.set()
    self._closed.wait(timeout=10)
