"""The pure steps against independent references: optax's loss, one big batch, plain JAX.

The references are jitted (one compile each) rather than run eagerly, which compiles every
operation of a forward and backward pass one by one."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lingvo_lite.training import steps, train_state
from lingvo_lite.training.objectives import lm
from lingvo_lite.training.objectives.objective import Forward
from lingvo_lite.testing import synthetic_tiny_setup

SETUP = synthetic_tiny_setup("PyCodeTiny", "train_data.global_batch_size=8")


def _state_and_batch(setup=SETUP, step=0):
  optimizer = setup.optimizer.make(setup.train.steps)
  state = jax.jit(lambda rng: nn.meta.unbox(train_state.init_state(
      setup.model, optimizer, rng, setup.train_data.sequence_length)))(jax.random.key(0))
  batch = {k: jnp.asarray(v) for k, v in setup.train_data.batch(step).items()}
  return optimizer, state, batch


def _step(setup, optimizer, grad_accum_steps, z_loss=0.0):
  return jax.jit(functools.partial(
      steps.train_step, model=setup.model, optimizer=optimizer,
      schedule=setup.optimizer.schedule(setup.train.steps), z_loss=z_loss,
      grad_accum_steps=grad_accum_steps))


def test_loss_matches_optax_cross_entropy():
  optimizer, state, batch = _state_and_batch()
  batch["weights"] = batch["weights"].at[:, -5:].set(0.0)  # Padding must not count.
  _, metrics = _step(SETUP, optimizer, 1)(state, batch)
  logits = jax.jit(SETUP.model.apply)({"params": state.params}, batch["inputs"])
  per_token = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
  expected = jnp.sum(per_token * batch["weights"]) / jnp.sum(batch["weights"])
  np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-6)


def test_gradient_accumulation_equals_one_big_batch():
  optimizer, state, batch = _state_and_batch()
  batch["weights"] = batch["weights"].at[0, :9].set(0.0)  # Uneven token counts per micro-batch.
  copy = lambda tree: jax.tree.map(jnp.array, tree)
  big_state, big_metrics = _step(SETUP, optimizer, 1)(copy(state), batch)
  accum_state, accum_metrics = _step(SETUP, optimizer, 4)(copy(state), batch)
  for key in ("loss", "grad_norm", "tokens"):
    np.testing.assert_allclose(accum_metrics[key], big_metrics[key], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               accum_state.params, big_state.params)


def test_z_loss_adds_weighted_log_partition_squared():
  optimizer, state, batch = _state_and_batch()
  plain = jax.jit(jax.grad(lambda p: lm.loss_sums(Forward(SETUP.model), p, batch, 0.0)[0]))(
      state.params)
  with_z = jax.jit(jax.grad(lambda p: lm.loss_sums(Forward(SETUP.model), p, batch, 1e-2)[0]))(
      state.params)

  def reference(params):
    logits = SETUP.model.apply({"params": params}, batch["inputs"])
    return jnp.sum(jnp.square(jax.nn.logsumexp(logits, -1)) * batch["weights"])
  z_grad = jax.jit(jax.grad(reference))(state.params)
  # Gradients are O(1) sums over 4096 tokens; 1e-5 absolute is float32 summation order.
  jax.tree.map(lambda a, b, z: np.testing.assert_allclose(a, b + 1e-2 * z, rtol=1e-4,
                                                          atol=1e-5), with_z, plain, z_grad)


def test_update_matches_a_plain_optax_step():
  """The train step's new params equal grad -> optimizer.update done by hand."""
  optimizer, state, batch = _state_and_batch()
  new_state, _ = _step(SETUP, optimizer, 1)(jax.tree.map(jnp.array, state), batch)

  def mean_loss(params):
    logits = SETUP.model.apply({"params": params}, batch["inputs"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
  grads = jax.jit(jax.grad(mean_loss))(state.params)
  updates, _ = optimizer.update(grads, state.opt_state, state.params)
  expected = optax.apply_updates(state.params, updates)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
               new_state.params, expected)
  assert int(new_state.step) == 1


def test_eval_step_sums_match_train_loss():
  optimizer, state, batch = _state_and_batch()
  sums = jax.jit(functools.partial(steps.eval_step, model=SETUP.model))(state.params, batch)
  _, metrics = _step(SETUP, optimizer, 1)(jax.tree.map(jnp.array, state), batch)
  np.testing.assert_allclose(sums["cross_entropy_sum"] / sums["weight_sum"], metrics["loss"],
                             rtol=1e-6)


def test_grad_norm_metric_is_the_global_norm_and_optional():
  optimizer, state, batch = _state_and_batch()
  step = lambda log: jax.jit(functools.partial(
      steps.train_step, model=SETUP.model, optimizer=optimizer,
      schedule=SETUP.optimizer.schedule(SETUP.train.steps), log_grad_norm=log))
  _, metrics = step(True)(jax.tree.map(jnp.array, state), batch)
  grads = jax.jit(jax.grad(lambda p: lm.loss_sums(Forward(SETUP.model), p, batch, 0.0,
                                                  jnp.sum(batch["weights"]))[0]))(state.params)
  np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(grads), rtol=1e-5)
  _, metrics = step(False)(jax.tree.map(jnp.array, state), batch)
  assert "grad_norm" not in metrics
