"""The compilation cache a run uses, and the one it must not: off means off, whatever JAX
was told before (by $JAX_COMPILATION_CACHE_DIR, or by a compile earlier in the process).

A saved step (`--mode=compile --compiled_step_out`) that came out of JAX's cache on XLA:CPU
loses its kernels ("Function ... not found" when train loads it); these tests pin the cause
below that symptom: after `configure()` of a cache that is off, nothing is read from or
written to a folder JAX knew before.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache import compilation_cache as jax_compilation_cache

from lingvo_lite.runtime import compilation_cache


@pytest.fixture
def warm_folder(tmp_path):
  """A folder JAX already uses (as $JAX_COMPILATION_CACHE_DIR would make it), with one
  compile in it, so that JAX has decided that this process uses its cache."""
  folder = tmp_path / "from_the_environment"
  jax.config.update("jax_compilation_cache_dir", str(folder))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_enable_compilation_cache", True)
  jax_compilation_cache.reset_cache()
  jax.jit(lambda x: x * 3 + 1).lower(jnp.zeros(7)).compile()
  assert os.listdir(folder), "JAX should have written the first compile"
  return folder


def _compile_something_new(size: int) -> None:
  jax.jit(lambda x: jnp.sin(x) * size).lower(jnp.zeros(size)).compile()


@pytest.mark.parametrize("value,given,used", [
    ("", True, True),  # --compilation_cache_dir=
    ("DEFAULT", False, False),  # compile (its program does not use the cache), flag not given
    ("GIVEN", True, False),  # compile, given a folder: checked, still not used
])
def test_a_run_without_the_cache_writes_nothing_where_jax_was_told_before(
    warm_folder, tmp_path, value, given, used):
  value = {"DEFAULT": str(tmp_path / "default"), "GIVEN": str(tmp_path / "given")}.get(value, value)
  before = sorted(os.listdir(warm_folder))
  cache = compilation_cache.choose(value, given, used, job_dir=None)
  assert cache.folder is None
  cache.configure()
  _compile_something_new(11)
  assert sorted(os.listdir(warm_folder)) == before
  for folder in (tmp_path / "default", tmp_path / "given"):
    assert not folder.exists() or not os.listdir(folder)


def test_a_run_with_its_folder_writes_there_and_not_where_jax_was_told_before(
    warm_folder, tmp_path):
  before = sorted(os.listdir(warm_folder))
  cache = compilation_cache.choose(str(tmp_path / "own"), True, True, job_dir=None)
  cache.configure()
  _compile_something_new(13)
  assert os.listdir(tmp_path / "own")
  assert sorted(os.listdir(warm_folder)) == before
