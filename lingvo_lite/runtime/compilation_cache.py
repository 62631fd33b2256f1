"""JAX's persistent compilation cache: which folder a run uses, checked before anything runs.

JAX finds out that its cache folder cannot be used only at its first compile, and then goes on
with a warning per compile. A folder the user gave that cannot be used is their mistake to fix
(one line, exit 2); the default one (a read-only home, say) only costs the cache, with one
warning printed once the run gets as far as compiling, so that a run refused before that says
its one line alone.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
from etils import epath
from jax.experimental.compilation_cache import compilation_cache as jax_compilation_cache

from lingvo_lite import outputs, paths
from lingvo_lite.errors import UsageError, os_error_text

# JAX's own variable, where it is set, names the folder the user keeps JAX's programs in.
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"
DEFAULT_FOLDER = os.environ.get(JAX_ENV) or os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "lingvo_lite", "jax")
_FIX = ("give a folder for JAX's compiled programs, or --compilation_cache_dir= to run without "
        "the cache")


@dataclasses.dataclass(frozen=True)
class CompilationCache:
  """The cache a run uses: `folder` (None: no cache), and the `warning` to print when the run
  compiles (None: nothing to say). `for_jax`: JAX's persistent cache uses the folder (the
  compile program keeps only its own analyses there: programs/compile/analyses.py)."""

  folder: str | None = None
  warning: str | None = None
  for_jax: bool = True

  def configure(self) -> None:
    """Points JAX at the folder (every compile cached), or turns JAX's cache off, and says why
    there is none where the user should know.

    Off means off: JAX also reads a folder from $JAX_COMPILATION_CACHE_DIR, and a program that
    must not use the cache (compile: XLA:CPU cannot serialize an executable that came out of
    it; the saved step would lose its kernels, "Function ... not found" when it runs) or a run
    given --compilation_cache_dir= must not get it from there.
    """
    if self.warning:
      print(f"lingvo_lite: warning: {self.warning}", file=sys.stderr, flush=True)
    used = bool(self.folder) and self.for_jax
    if used:
      jax.config.update("jax_compilation_cache_dir", self.folder)
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_enable_compilation_cache", used)
    # JAX decides at a process's first compile whether it uses its cache, and keeps to that
    # answer; whatever compiled before this (building the Setup) must not decide it.
    jax_compilation_cache.reset_cache()


def choose(value: str, given: bool, used: bool, job_dir: epath.Path | None,
           for_jax: bool = True) -> CompilationCache:
  """The cache of `--compilation_cache_dir=value` (`given` on the command line, or the default),
  for a mode that compiles (`used`) or not, through JAX's cache (`for_jax`) or not.

  Raises:
    UsageError: a given value is blank, names a file, a folder under a file, a folder in which
      nothing can be created, or a place inside a job's checkpoints.
  """
  if value and not value.strip():  # A quoting slip, not a folder named ' ' in the cwd.
    raise UsageError(f"--compilation_cache_dir={value!r}: blank; {_FIX}")
  if not value or not (given or used):
    return CompilationCache()
  path = paths.resolve(value, "--compilation_cache_dir")
  if given:  # Retention deletes a checkpoint step's folder with whatever was put into it.
    outputs.refuse_inside_checkpoints(path, f"--compilation_cache_dir={value}", job_dir)
  problem = None if paths.is_remote(str(path)) else _unwritable_folder(path)
  if problem is None:
    # A program that does not use the cache still refuses a bad folder given to it, alike.
    return CompilationCache(folder=os.fspath(path) if used else None, for_jax=for_jax)
  if given:
    raise UsageError(f"--compilation_cache_dir={value}: {problem}; {_FIX}")
  return CompilationCache(for_jax=for_jax, warning=(
      f"running without the compilation cache: {path} {problem}; pass "
      "--compilation_cache_dir=FOLDER, or --compilation_cache_dir= to silence this"))


def _unwritable_folder(path: epath.Path) -> str | None:
  """Why files cannot be made in the local folder `path` (created if absent), or None
  (paths.creation_problem tries it: root passes every permission check, and a read-only file
  system or /proc refuses what os.access allows)."""
  existing = path
  while not os.path.lexists(os.fspath(existing)):
    existing = existing.parent
  if not existing.is_dir():
    return "is not a folder" if existing == path else f"is under {existing}, which is no folder"
  error = paths.creation_problem(existing)
  if error is None:
    return None
  where = "in it" if existing == path else f"in {existing}"
  problem, _ = os_error_text(error)
  return f"cannot be written (creating a folder {where} fails: {problem})"
