"""Pure step functions shared by every program: train, eval and AOT compile jit these same
functions with the same shardings, so what compiles is what trains.

No I/O, no flags, no config objects: a step receives the model, the optax transformation
and plain numbers. A batch is a dict of arrays:
  inputs [B, T] int32, targets [B, T] int32, weights [B, T] float32 (0 on padding),
  and optionally segment_ids [B, T] and positions [B, T] for packed examples.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from lingvo_lite.training.train_state import TrainState

Batch = dict[str, jax.Array]


def token_losses(logits: jax.Array, targets: jax.Array
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per-token cross-entropy, log-partition log(Z) and correctness, float32 [B, T].

  One max over the vocabulary serves both the stable log-sum-exp and the accuracy (the
  target is the argmax when its logit reaches the max), so the logits are read once less.
  """
  max_logit = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
  log_z = jnp.log(jnp.sum(jnp.exp(logits - max_logit[..., None]), axis=-1)) + max_logit
  target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  return log_z - target_logits, log_z, (target_logits >= max_logit).astype(jnp.float32)


def _loss_sums(params: Any, model: nn.Module, batch: Batch, z_loss: float,
               normalizer: jax.Array | float = 1.0, per_token: bool = False
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(cross-entropy + z_loss * log(Z)^2) summed over weighted tokens / normalizer, plus the
  model's auxiliary objective (a mixture of experts' balance loss) weighted by this batch's
  share of the tokens, and the metric sums (with `per_token`, also each token's weighted
  cross-entropy, `token_nats`). Dividing inside the objective, by a constant, gives gradients
  already normalized (no extra pass over them); the model's statistics are summed weighted
  by the batch's tokens, so micro-batches and eval batches average them as they do the loss."""
  logits, auxiliary, statistics = model.logits_and_losses(
      params, batch["inputs"], batch.get("segment_ids"), batch.get("positions"))
  cross_entropy, log_z, correct = token_losses(logits, batch["targets"])
  # One reduction for the three sums: on CPU each separate reduction is its own kernel.
  ce_sum, z_sum, correct_sum = jnp.sum(
      jnp.stack([cross_entropy, jnp.square(log_z), correct]) * batch["weights"], axis=(1, 2))
  objective = (ce_sum + z_loss * z_sum if z_loss else ce_sum) / normalizer
  sums = {"cross_entropy_sum": ce_sum, "z_sum": z_sum, "correct_sum": correct_sum}
  if statistics:
    tokens = jnp.sum(batch["weights"])
    objective = objective + auxiliary * tokens / normalizer
    sums.update({f"{name}{STATISTIC_SUM}": value * tokens for name, value in statistics.items()})
  if per_token:
    sums["token_nats"] = cross_entropy * batch["weights"]
  return objective, sums


# The suffix of a model statistic's weighted sum among the metric sums.
STATISTIC_SUM = "__sum"


def model_statistics(sums: dict[str, jax.Array], weight: Any) -> dict[str, Any]:
  """The model's statistics (`logits_and_losses`) from their weighted sums, by name."""
  return {name[:-len(STATISTIC_SUM)]: value / weight for name, value in sums.items()
          if name.endswith(STATISTIC_SUM)}


def _global_norm(tree: Any, ravel: bool) -> jax.Array:
  """L2 norm over every leaf, accumulated in float32.

  With `ravel`, as one reduction over the concatenated leaves: on a CPU a per-leaf norm adds a
  reduction kernel for every parameter next to the optimizer's update kernel, and those ~3
  extra kernels per parameter cost more than the one concatenation (measured: 1256 -> 1031
  kernels in the BenchLarge step). Elsewhere each leaf is reduced where it lies: on a mesh the
  concatenation would gather every sharded gradient whole onto each device (24 GB of float32
  for GPT-J-6B), and on one accelerator it is a float32 copy of every gradient (2 GiB for a
  552M model on a 16 GiB TPU v5e chip), where a per-leaf reduction fuses the square into the
  sum and writes nothing.
  """
  if ravel:
    return jnp.sqrt(jnp.sum(jnp.square(ravel_pytree(tree)[0])))
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def _split_micro_batches(batch: Batch, num_micro_batches: int) -> Batch:
  return jax.tree.map(
      lambda x: x.reshape(num_micro_batches, x.shape[0] // num_micro_batches, *x.shape[1:]),
      batch)


def train_step(state: TrainState, batch: Batch, *, model: nn.Module,
               optimizer: optax.GradientTransformation, schedule: optax.Schedule,
               z_loss: float = 0.0, grad_accum_steps: int = 1, log_grad_norm: bool = True,
               ravel_norm: bool = True) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update on the mean token loss of `batch`.

  With `grad_accum_steps` k > 1 the batch is cut into k micro-batches whose gradients are
  summed before the update. Each micro-batch's loss is divided by the token count of the
  whole batch, so the update equals the one-big-batch update (up to summation order).
  `ravel_norm`: the gradient norm as one reduction over the concatenated gradients (fastest
  on one CPU device; see `_global_norm`).
  """
  total_weight = jnp.maximum(jnp.sum(batch["weights"]), 1.0)
  grad_fn = jax.grad(_loss_sums, has_aux=True)

  if grad_accum_steps == 1:
    grads, sums = grad_fn(state.params, model, batch, z_loss, total_weight)
  else:
    def accumulate(carry, micro_batch):
      grads, sums = grad_fn(state.params, model, micro_batch, z_loss, total_weight)
      return jax.tree.map(jnp.add, carry, (grads, sums)), None

    micro_batches = _split_micro_batches(batch, grad_accum_steps)
    # The sums a micro-batch gives (the model's statistics among them), as zeros to add to.
    _, sum_shapes = jax.eval_shape(lambda params, micro_batch: grad_fn(
        params, model, micro_batch, z_loss, total_weight), state.params,
                                   jax.tree.map(lambda x: x[0], micro_batches))
    zeros = (jax.tree.map(jnp.zeros_like, state.params),
             jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sum_shapes))
    (grads, sums), _ = jax.lax.scan(accumulate, zeros, micro_batches)

  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {
      "loss": sums["cross_entropy_sum"] / total_weight,
      "z_loss": sums["z_sum"] / total_weight,
      "accuracy": sums["correct_sum"] / total_weight,
      "learning_rate": schedule(state.step),
      "tokens": total_weight,
      **model_statistics(sums, total_weight),
  }
  if log_grad_norm:
    # An extra pass over every gradient (the optimizer's clipping computes its own norm).
    metrics["grad_norm"] = _global_norm(grads, ravel_norm)
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: Batch, *, model: nn.Module, per_token: bool = False
              ) -> dict[str, jax.Array]:
  """Metric sums over one eval batch; the caller adds them up and divides by `weight_sum`.
  With `per_token`, also each token's weighted cross-entropy [B, T] (`token_nats`), for
  per-document scores."""
  _, sums = _loss_sums(params, model, batch, 0.0, per_token=per_token)
  return {**sums, "weight_sum": jnp.sum(batch["weights"])}


def is_finite(tree: Any) -> jax.Array:
  """A scalar: whether every float in `tree` (a state: parameters and optimizer moments) is
  finite. Computed where the arrays are, so only one bool crosses to the host."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  if not leaves:
    return jnp.array(True)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
