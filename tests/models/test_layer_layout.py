"""Scanned and unrolled layers compute the same thing, and a checkpoint written with one
layout resumes with the other."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.models.layer_layout import stack_layers, unstack_layers
from lingvo_lite.testing import run_cli, synthetic_tiny_setup

SETS = ("model.num_layers=3", "train.steps=5")


def _losses(setup, state_fn):
  jitted = JittedSteps(setup)
  losses = []
  with jitted.activated():
    state = state_fn(jitted)
    for step in range(5):
      state, metrics = jitted.train_step(state, jitted.global_batch(setup.train_data.batch(step)))
      losses.append(float(metrics["loss"]))
  return losses, state


def test_scan_and_unrolled_layers_train_alike():
  unrolled = synthetic_tiny_setup("PyCodeLlamaTiny", *SETS)
  scanned = synthetic_tiny_setup("PyCodeLlamaTiny", *SETS, "model.scan_layers=True",
                                 "model.remat_policy='dots_saveable'")
  initial = {}

  def init_unrolled(jitted):
    initial["state"] = jax.device_get(jitted.init_state())
    return jitted.init_state()

  unrolled_losses, _ = _losses(unrolled, init_unrolled)
  scanned_losses, _ = _losses(
      scanned, lambda jitted: jax.device_put(stack_layers(initial["state"]),
                                             jitted.sharded_state.shardings))
  # Losses, not parameters, are compared: Adam divides by the root of tiny second moments,
  # so float32 summation-order noise in near-zero gradients moves single weights visibly.
  np.testing.assert_allclose(scanned_losses, unrolled_losses, rtol=1e-5)


def test_stack_and_unstack_are_inverses():
  params = {"embedding": jnp.ones((5, 2)),
            **{f"layer_{i}": {"w": jnp.full((2, 3), float(i)), "b": jnp.full((3,), -i)}
               for i in range(4)}}
  stacked = stack_layers(params)
  assert set(stacked) == {"embedding", "layers"}
  assert stacked["layers"]["w"].shape == (4, 2, 3)
  np.testing.assert_array_equal(stacked["layers"]["b"][2], [-2, -2, -2])
  jax.tree.map(np.testing.assert_array_equal, unstack_layers(stacked), params)


def test_remat_policies_give_the_same_gradients():
  grads = {}
  for policy in ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable"):
    setup = synthetic_tiny_setup("PyCodeTiny", f"model.remat_policy='{policy}'")
    tokens = jnp.asarray(setup.train_data.batch(0)["inputs"])
    params = nn.meta.unbox(setup.model.init(jax.random.key(0), tokens))
    grads[policy] = jax.jit(jax.grad(lambda p: setup.model.apply(p, tokens).mean()))(params)
  for policy, value in grads.items():
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 value, grads["none"])


def test_an_unrolled_checkpoint_resumes_with_scanned_layers(tmp_path):
  base = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
          "--fdl.train.log_every_steps=1",
          "--fdl.optimizer.decay_steps=20"]
  whole, parts = tmp_path / "whole", tmp_path / "parts"
  assert run_cli([*base, f"--job_log_dir={whole}", "--fdl.train.steps=6"]).code == 0
  assert run_cli([*base, f"--job_log_dir={parts}", "--fdl.train.steps=3"]).code == 0
  resumed = run_cli([*base, f"--job_log_dir={parts}", "--fdl.train.steps=6",
                     "--fdl.model.scan_layers=True"])
  assert resumed.code == 0, resumed.stderr
  assert "resumed from step 3" in resumed.stdout

  def losses(job):
    with open(os.path.join(job, "metrics.jsonl")) as f:
      return [json.loads(line)["loss"] for line in f]
  np.testing.assert_allclose(losses(parts), losses(whole), rtol=1e-5)
