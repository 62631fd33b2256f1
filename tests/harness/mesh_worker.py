"""Runs in a child process with 4 forced CPU devices (XLA_FLAGS set by the parent test): the
tiny job's model through lm_eval's request kinds on a data=2 x fsdp=2 mesh, printed as one
JSON object for tests/harness/test_harness_mesh.py to compare with one device.

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m tests.harness.mesh_worker JOB
"""

import json
import sys

import jax

from lingvo_lite.harness import request_kinds as harness
from lingvo_lite.serving import loaded_model
from tests.harness.mesh_requests import GENERATE, PAIRS, TEXTS


def main(job: str) -> None:
  model = loaded_model.from_job(job, assignments=["partitioner.ici_data=2",
                                                  "partitioner.ici_fsdp=2"])
  # The parameters' own placement: the mesh they live on, and how many devices hold parts.
  leaves = jax.tree.leaves(model.generator.params)
  print(json.dumps({
      "devices": len(jax.devices()),
      "mesh": dict(leaves[0].sharding.mesh.shape),
      "sharded_leaves": sum(not leaf.sharding.is_fully_replicated for leaf in leaves),
      "loglikelihood": harness.loglikelihood(model, PAIRS),
      "rolling": harness.loglikelihood_rolling(model, TEXTS, 24),
      "generated": harness.generate_until(model, GENERATE),
  }))


if __name__ == "__main__":
  main(sys.argv[1])
