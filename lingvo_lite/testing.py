"""Helpers for tests: tiny setups, the CLI run in-process, job-dir digests, shaped batches."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
from typing import Any, Sequence

import fiddle as fdl
import jax
import jax.numpy as jnp
from absl import flags

from lingvo_lite import executor, fiddlers, overrides, registry
from lingvo_lite.experiment import Setup
from lingvo_lite.programs.jitted import JittedSteps


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
  return executor.build(tiny_config(experiment, *sets, synthetic=True))


def shaped_batch(setup: Setup) -> dict[str, jax.ShapeDtypeStruct]:
  """Abstract global batch of the train data, for lowering without data."""
  shape = (setup.train_data.global_batch_size, setup.train_data.sequence_length)
  return {"inputs": jax.ShapeDtypeStruct(shape, jnp.int32),
          "targets": jax.ShapeDtypeStruct(shape, jnp.int32),
          "weights": jax.ShapeDtypeStruct(shape, jnp.float32)}


def assert_experiment_lowers(setup: Setup) -> Any:
  """Shapes the state and lowers the train step on the available devices; returns lowered."""
  jitted = JittedSteps(setup)
  with jitted.activated():
    return jitted.train_step.lower(jitted.sharded_state.abstract, shaped_batch(setup))


@dataclasses.dataclass(frozen=True)
class CliResult:
  code: int
  stdout: str
  stderr: str


def run_cli(args: Sequence[str]) -> CliResult:
  """Runs the executor in this process, as `python -m lingvo_lite ARGS` would.

  Sharing the process saves the ~6 s import of the stack per case; flags are reset first.
  """
  flags.FLAGS.unparse_flags()
  stdout, stderr = io.StringIO(), io.StringIO()
  code = 0
  with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    try:
      executor.parse_flags(["lingvo_lite", *args])
      executor.main([])
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else 1
  flags.FLAGS.unparse_flags()
  return CliResult(code, stdout.getvalue(), stderr.getvalue())


def tree_digest(root: str | os.PathLike) -> str:
  """SHA-256 over every path, file size and file content under `root`."""
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
