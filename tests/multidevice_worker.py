"""Runs in a child process with 8 forced CPU devices (XLA_FLAGS set by the parent test) and
prints one JSON object: per-mesh losses and parameter PartitionSpecs, and the outcome of
bad partitioning commands. The parent (tests/test_partitioning.py) asserts on it.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.multidevice_worker
"""

import json
import sys
import tempfile

import jax
import numpy as np
import optax

from lingvo_lite.programs.jitted import JittedSteps
from lingvo_lite.testing import run_cli, synthetic_tiny_setup

SETS = ("model.vocab_size=256", "train_data.vocab_size=256", "eval_data.vocab_size=256",
        "train_data.global_batch_size=8", "eval_data.global_batch_size=8",
        "optimizer.warmup_steps=1")
MESHES = {"single": None, "data8": (8, 1, 1), "fsdp8": (1, 8, 1), "data2_fsdp2_tensor2": (2, 2, 2)}
BAD_PARTITIONING = {
    "mesh_vs_devices": ["--fdl.partitioner.ici_data=3"],
    "batch_vs_data_parallel": ["--fdl.train_data.global_batch_size=4"],
    "dimension_vs_axis": ["--fdl.partitioner.ici_data=1", "--fdl.partitioner.ici_tensor=8"],
    "unknown_logical_axis": ["--fdl.partitioner.rules=(('batch', 'data'), ('embd', 'fsdp'))"],
    "unknown_mesh_axis": ["--fdl.partitioner.rules=(('batch', 'dp'),)"],
}


def _losses_and_specs(mesh_shape):
  sets = SETS
  if mesh_shape is not None:
    sets += tuple(f"partitioner.ici_{axis}={size}"
                  for axis, size in zip(("data", "fsdp", "tensor"), mesh_shape))
  setup = synthetic_tiny_setup("PyCodeLlamaTiny", *sets)
  devices = jax.devices()[:1] if mesh_shape is None else jax.devices()
  jitted = JittedSteps(setup, setup.partitioner.make_mesh(devices))
  losses = []
  with jitted.activated():
    state = jitted.init_state()
    for step in range(5):
      state, metrics = jitted.train_step(state, jitted.global_batch(setup.train_data.batch(step)))
      losses.append(float(metrics["loss"]))
  shardings = jitted.sharded_state.shardings
  specs = {jax.tree_util.keystr(path): str(sharding.spec) for path, sharding in
           jax.tree_util.tree_flatten_with_path(shardings.params)[0]}
  # Adam's moments must be sharded like the parameters they follow.
  mu = optax.tree_utils.tree_get(state.opt_state, "mu")
  moments_match = all(m.sharding.spec == p.sharding.spec for m, p in
                      zip(jax.tree.leaves(mu), jax.tree.leaves(state.params)))
  return {"losses": losses, "specs": specs, "moments_match": moments_match,
          "finite": bool(np.isfinite(losses).all())}


def main():
  assert jax.device_count() == 8, jax.device_count()
  result = {"meshes": {name: _losses_and_specs(shape) for name, shape in MESHES.items()}}
  result["bad"] = {}
  with tempfile.TemporaryDirectory() as job:
    for name, args in BAD_PARTITIONING.items():
      outcome = run_cli(["--exp=PyCodeLlamaTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
                         f"--job_log_dir={job}/{name}", "--compilation_cache_dir=", *args])
      result["bad"][name] = {"code": outcome.code, "stderr": outcome.stderr}
  json.dump(result, sys.stdout)


if __name__ == "__main__":
  main()
