"""The lm_eval request kinds on a mesh: the tiny job's model sharded data=2 x fsdp=2 over 4
forced CPU devices (a child process: the device count is fixed when JAX starts) gives the
single-device loglikelihoods, rolling totals and generations."""

import json
import os
import subprocess
import sys

import pytest

from lingvo_lite.harness import request_kinds as harness
from lingvo_lite.serving import loaded_model
from tests.harness.mesh_requests import GENERATE, PAIRS, TEXTS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_a_data_and_fsdp_sharded_model_scores_and_generates_as_one_device(tiny_job):
  job = str(tiny_job / "runs/tiny")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  child = subprocess.run([sys.executable, "-m", "tests.harness.mesh_worker", job], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert child.returncode == 0, child.stderr[-3000:]
  sharded = json.loads(child.stdout.strip().splitlines()[-1])
  assert sharded["devices"] == 4 and sharded["mesh"]["data"] == 2 and (
      sharded["mesh"]["fsdp"] == 2), sharded["mesh"]
  assert sharded["sharded_leaves"] > 0  # The parameters are split, not copied whole.

  model = loaded_model.from_job(job)
  for (value, greedy), (theirs, their_greedy) in zip(harness.loglikelihood(model, PAIRS),
                                                     sharded["loglikelihood"]):
    assert theirs == pytest.approx(value, abs=1e-4) and their_greedy == greedy
  assert sharded["rolling"] == pytest.approx(harness.loglikelihood_rolling(model, TEXTS, 24),
                                             abs=1e-4)
  # Greedy and seeded sampling: the same tokens (the sharded sums reorder float additions
  # by ~1e-6; the tiny model has no near-tie in these).
  assert sharded["generated"] == harness.generate_until(model, GENERATE)
