"""The optimizer chain: what is decayed, the schedule's shape, clipping; bfloat16 moments and
an optimizer state offloaded to host memory against optax's float32 AdamW."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from etils import epath

from lingvo_lite.checkpoints.manager import CheckpointSettings, Checkpointer
from lingvo_lite.errors import UsageError
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.testing import synthetic_tiny_setup
from lingvo_lite.training import steps
from lingvo_lite.training.optimizers import AdamW, decay_mask


def test_decay_mask_skips_biases_and_norm_scales():
  params = {"dense": {"kernel": jnp.ones((3, 4)), "bias": jnp.ones((4,))},
            "norm": {"scale": jnp.ones((4,))}, "attention": {"query_kernel": jnp.ones((2, 2, 2))}}
  assert decay_mask(params) == {"dense": {"kernel": True, "bias": False},
                                "norm": {"scale": False}, "attention": {"query_kernel": True}}


def test_weight_decay_leaves_vectors_alone():
  """With zero gradients only decoupled weight decay moves parameters: matrices only."""
  optimizer = AdamW(peak_learning_rate=0.1, warmup_steps=0, weight_decay=0.5,
                    clip_grad_norm=None).make(100)
  params = {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,))}
  state = optimizer.init(params)
  updates, _ = optimizer.update(jax.tree.map(jnp.zeros_like, params), state, params)
  new = optax.apply_updates(params, updates)
  np.testing.assert_array_equal(new["bias"], params["bias"])
  assert float(new["kernel"][0, 0]) < 1.0


def test_schedule_warms_up_then_decays_to_the_final_ratio():
  schedule = AdamW(peak_learning_rate=1.0, warmup_steps=10,
                   final_learning_rate_ratio=0.1).schedule(110)
  np.testing.assert_allclose(schedule(0), 0.0)
  np.testing.assert_allclose(schedule(5), 0.5, rtol=1e-6)
  np.testing.assert_allclose(schedule(10), 1.0, rtol=1e-6)
  np.testing.assert_allclose(schedule(60), 0.55, rtol=1e-5)  # Half way down the cosine.
  np.testing.assert_allclose(schedule(110), 0.1, rtol=1e-5)


def test_clipping_bounds_the_global_norm():
  optimizer = AdamW(clip_grad_norm=1.0)
  clipped = optax.clip_by_global_norm(optimizer.clip_grad_norm)
  grads = {"a": jnp.full((4,), 10.0)}
  out, _ = clipped.update(grads, clipped.init(grads))
  np.testing.assert_allclose(optax.tree.norm(out), 1.0, rtol=1e-6)
  chain = optimizer.make(10)
  assert len(chain.init({"a": jnp.ones(2)})) == 2  # clip, then AdamW.


def _adam_node(opt_state):
  """The ScaleByAdamState (count, mu, nu) of an AdamW chain's state."""
  return next(n for n in jax.tree.leaves(
      opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
              if isinstance(n, optax.ScaleByAdamState))


def _assert_rounded_to_nearest(stored, exact):
  """Each stored bfloat16 moment is the float32 value rounded to nearest: where it is not
  the reference's own rounding, it is as near the reference's value, to that value's float32
  round-off (a near tie that the two float32 computations, fused differently, round apart)."""
  stored = np.asarray(stored, np.float32)
  exact = np.asarray(exact, np.float32)
  expected = exact.astype(jnp.bfloat16).astype(np.float32)
  round_off = 8 * 2.0**-24 * np.abs(exact)  # A few float32 operations' worth.
  ok = (stored == expected) | (np.abs(stored - exact) <= np.abs(expected - exact) + round_off)
  assert ok.all(), (stored[~ok][:5], exact[~ok][:5])


def test_bfloat16_moments_offloaded_update_as_float32_adam_rounded_and_resume(tmp_path):
  """Each of a few steps of the project's jitted train step, with bfloat16 moments kept in
  host memory, equals a step of optax's float32 AdamW (chained here) from the same state with
  its moments upcast: the same parameters to float32 round-off, and the new moments rounded to
  nearest bfloat16 (the gradients come from the same step function, so only the optimizers
  differ). The checkpoint holds bfloat16 moments, a resume continues exactly, and a float32
  job's checkpoint is refused, not cast. A CPU device has a pinned host memory space, so the
  offload runs here (the programs refuse it on a CPU target, where it buys nothing)."""
  base = synthetic_tiny_setup()
  lr = 1e-2
  optimizer = dataclasses.replace(base.optimizer, peak_learning_rate=lr, warmup_steps=0,
                                  final_learning_rate_ratio=1.0, moment_dtype="bfloat16",
                                  offload_state=True)
  setup = dataclasses.replace(base, optimizer=optimizer)
  jitted = JittedSteps(setup)
  reference_step = jax.jit(functools.partial(steps.train_step, model=setup.model, optimizer=(
      optax.chain(optax.clip_by_global_norm(optimizer.clip_grad_norm),
                  optax.adamw(lr, b1=optimizer.b1, b2=optimizer.b2, eps=optimizer.eps,
                              weight_decay=optimizer.weight_decay,
                              mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)))),
      schedule=lambda _: lr))
  upcast = lambda x: np.asarray(x, np.float32 if x.dtype == jnp.bfloat16 else x.dtype)
  state = jitted.init_state()
  for i in range(3):
    batch = jitted.training_batch(setup.train_data.batch(i), state)
    reference, _ = reference_step(jax.tree.map(upcast, state), batch)
    state, _ = jitted.train_step(state, batch)  # Donates the state the reference read.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9),
                 state.params, reference.params)
    ours, theirs = _adam_node(state.opt_state), _adam_node(reference.opt_state)
    assert int(ours.count) == int(theirs.count) == i + 1
    for stored, exact in zip(jax.tree.leaves((ours.mu, ours.nu)),
                             jax.tree.leaves((theirs.mu, theirs.nu))):
      assert stored.dtype == jnp.bfloat16 and stored.sharding.memory_kind == "pinned_host"
      _assert_rounded_to_nearest(stored, exact)
  assert bool(jitted.state_is_finite(state))
  checkpointer = Checkpointer(epath.Path(tmp_path / "bf16"), CheckpointSettings(every_steps=1))
  checkpointer.save(3, state.checkpointed())
  checkpointer.wait()
  restored = jitted.restore_state(checkpointer, 3)
  for leaf in jax.tree.leaves(_adam_node(restored.opt_state)[1:]):  # mu, nu
    assert leaf.dtype == jnp.bfloat16 and leaf.sharding.memory_kind == "pinned_host"
  batch = jitted.training_batch(setup.train_data.batch(3), state)
  resumed, _ = jitted.train_step(restored, batch)
  continued, _ = jitted.train_step(state, batch)
  jax.tree.map(np.testing.assert_array_equal, resumed, continued)
  checkpointer.close()
  # A job whose moments are float32 (the default) is refused, not read into bfloat16 ones.
  plain = JittedSteps(dataclasses.replace(setup, optimizer=base.optimizer))
  checkpointer = Checkpointer(epath.Path(tmp_path / "f32"), CheckpointSettings(every_steps=1))
  checkpointer.save(0, plain.init_state().checkpointed())
  checkpointer.wait()
  with pytest.raises(UsageError, match=r"its opt_state/.*/mu/.* is float32, this config's is "
                     r"bfloat16; the model or optimizer differs"):
    jitted.restore_state(checkpointer, 0)
  checkpointer.close()
