"""XLA's analyses of the compile program's compiles, kept by the program they came from.

XLA:TPU takes 40 s of 2 cores to compile a 7B model's train step for a TPU slice, and its
executable cannot be kept: JAX's persistent cache writes it, but a compile-only TPU client cannot
load it back ("PjRtCompiler must be constructed with a Client to call
DeserializeLoadedExecutable"), which is why the compile program runs without JAX's cache. What
the program reports of a compile is small: XLA's memory analysis, its FLOPs, the largest
buffers of the optimized HLO, or the out-of-memory refusal. Those are kept here, one JSON file
per compile in `<compilation cache folder>/lingvo_lite_compile_analyses/` (runtime/kept_results.py),
named by a digest of everything the compile depends on:

  - the lowered program's text: the computation, its shapes, shardings and donations;
  - the target's devices (kind, id, process, coordinates): the device assignment;
  - the compiler: jax, jaxlib and libtpu versions, and the XLA_FLAGS / LIBTPU_INIT_ARGS the
    process runs with.

The same compile again (a repeated command, a max-batch search that meets a size again, another
test of the same experiment) reads them instead of compiling, and says so in its report with the
seconds the first compile took. A compile whose executable is needed (--compiled_step_out
saves it) always compiles. `--compilation_cache_dir=` (no cache) keeps nothing and reads
nothing. A file that cannot be read as written is ignored and compiled again.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from typing import Any, Iterator

import jax

from lingvo_lite.runtime import kept_results, run_info

KIND = "lingvo_lite_compile_analyses"
_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
_FOLDER: contextvars.ContextVar[str | None] = contextvars.ContextVar("analyses", default=None)


@contextlib.contextmanager
def kept_in(cache_folder: str | None) -> Iterator[None]:
  """Within it, compiles keep and read their analyses under `cache_folder` (None: neither)."""
  token = _FOLDER.set(cache_folder or None)
  try:
    yield
  finally:
    _FOLDER.reset(token)


def cache_folder() -> str | None:
  """The compilation cache folder compiles keep their analyses in now (None: none), which
  also keeps the host's measured matmul peak that a CPU target's report divides by."""
  return _FOLDER.get()


def _device(device: Any) -> list[Any]:
  coords = getattr(device, "coords", None)
  return [device.device_kind, device.id, getattr(device, "process_index", 0),
          list(coords) if coords is not None else None,
          getattr(device, "core_on_chip", None)]


def key(lowered: Any, devices: tuple[Any, ...]) -> str | None:
  """The digest of what the compile of `lowered` for `devices` depends on; None where no
  folder keeps analyses (then nothing is read or written)."""
  if _FOLDER.get() is None:
    return None
  return kept_results.digest({
      "program": lowered.as_text(),
      "devices": [_device(d) for d in devices],
      "versions": run_info.package_versions("jax", "jaxlib", "libtpu"),
      "env": {name: os.environ.get(name) for name in _ENV},
      "platform": jax.default_backend() if not devices else devices[0].platform,
  })


def read(digest: str | None) -> dict[str, Any] | None:
  """The analyses kept under `digest`, or None (none kept, no cache, or not readable whole)."""
  return kept_results.read(_FOLDER.get(), KIND, digest) if digest else None


def write(digest: str | None, analyses: dict[str, Any]) -> None:
  """Keeps `analyses` under `digest`; a cache that cannot be written costs only the next
  compile's time."""
  if digest:
    kept_results.write(_FOLDER.get(), KIND, digest, analyses)


def as_dict(value: Any) -> Any:
  """A dataclass (or None) as JSON-ready data."""
  return None if value is None else dataclasses.asdict(value)
