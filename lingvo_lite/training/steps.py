"""Pure step functions shared by every program: train, eval and AOT compile jit these same
functions with the same shardings, so what compiles is what trains.

No I/O, no flags, no config objects: a step receives the model, the optax transformation
and plain numbers. A batch is a dict of arrays:
  inputs [B, T] int32, targets [B, T] int32, weights [B, T] float32 (0 on padding),
  and optionally segment_ids [B, T] and positions [B, T] for packed examples.

What a step trains is `state.params`: the model's parameters, or (`adapters=True`) a LoRA
model's adapters over the frozen base `state.frozen` (models/lora.py), which gets no gradient.
The objective is the next-token loss, or (`dpo`: training/dpo.py) DPO's loss over the batch's
preference pairs against the reference: the model applied to `state.frozen` alone (a LoRA
model without its adapters, or a full fine-tune's frozen copy).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from lingvo_lite.training import dpo as dpo_lib
from lingvo_lite.training.train_state import TrainState

Batch = dict[str, jax.Array]


def model_outputs(model: nn.Module, params: Any, batch: Batch, frozen: Any = None,
                  adapters: bool = False, rng: jax.Array | None = None
                  ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
  """The model's `logits_and_losses` on `batch` (its logits, auxiliary objective and
  statistics: models/family.py): with `adapters`, `params` are the LoRA adapters over the
  base `frozen`; `rng` draws the adapters' dropout (training only)."""
  base, lora = (frozen, params) if adapters else (params, None)
  return model.logits_and_losses(base, batch["inputs"], batch.get("segment_ids"),
                                 batch.get("positions"), adapters=lora,
                                 rngs=None if rng is None else {"dropout": rng})


def logits_of(model: nn.Module, params: Any, batch: Batch, frozen: Any = None,
              adapters: bool = False, rng: jax.Array | None = None) -> jax.Array:
  """The model's logits on `batch` (`model_outputs`' first)."""
  return model_outputs(model, params, batch, frozen, adapters, rng)[0]


def reference_logits(model: nn.Module, frozen: Any, batch: Batch) -> jax.Array:
  """The DPO reference's logits: the model applied to the frozen parameters alone (a LoRA
  model without its adapters is its base), with no gradient."""
  frozen = jax.lax.stop_gradient(frozen)
  return model.apply({"params": frozen}, batch["inputs"], batch.get("segment_ids"),
                     batch.get("positions"))


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
               normalizer: jax.Array | float = 1.0, per_token: bool = False,
               frozen: Any = None, adapters: bool = False, rng: jax.Array | None = None
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(cross-entropy + z_loss * log(Z)^2) summed over weighted tokens / normalizer, plus the
  model's auxiliary objective (a mixture of experts' balance loss) weighted by this batch's
  share of the tokens, and the metric sums (with `per_token`, also each token's weighted
  cross-entropy, `token_nats`). Dividing inside the objective, by a constant, gives gradients
  already normalized (no extra pass over them); the model's statistics are summed weighted
  by the batch's tokens, so micro-batches and eval batches average them as they do the loss."""
  logits, auxiliary, statistics = model_outputs(model, params, batch, frozen, adapters, rng)
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


def _dpo_sums(params: Any, model: nn.Module, batch: Batch, settings: dpo_lib.DpoSettings,
              normalizer: jax.Array | float = 1.0, frozen: Any = None, adapters: bool = False,
              rng: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """DPO's loss summed over the batch's pairs / normalizer (training/dpo.py), and its sums."""
  def sequences(logits):
    log_probs = -token_losses(logits, batch["targets"])[0]
    return dpo_lib.sequence_log_probs(log_probs, batch["weights"], batch["segment_ids"])

  policy = sequences(logits_of(model, params, batch, frozen, adapters, rng))
  reference = sequences(reference_logits(model, frozen, batch))[:2]
  sums = dpo_lib.sums(policy, reference, settings)
  return sums["dpo_loss_sum"] / normalizer, sums


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
               ravel_norm: bool = True, adapters: bool = False,
               dpo: dpo_lib.DpoSettings | None = None, dropout_seed: int | None = None
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update on the mean token loss of `batch` (with `dpo`: the mean DPO loss of
  its pairs).

  With `grad_accum_steps` k > 1 the batch is cut into k micro-batches whose gradients are
  summed before the update. Each micro-batch's loss is divided by the token (pair) count of
  the whole batch, so the update equals the one-big-batch update (up to summation order).
  `ravel_norm`: the gradient norm as one reduction over the concatenated gradients (fastest
  on one CPU device; see `_global_norm`). `adapters`: `state.params` are LoRA adapters over
  `state.frozen`; `dropout_seed`: the root of their dropout's keys, fold_in(seed, step) (and
  the micro-batch), so a resumed run draws the same masks.
  """
  if dpo is not None:
    total = jnp.maximum(dpo_lib.pair_count(batch["segment_ids"]), 1.0)
    objective = lambda params, micro_batch, rng: _dpo_sums(
        params, model, micro_batch, dpo, total, state.frozen, adapters, rng)
  else:
    total = jnp.maximum(jnp.sum(batch["weights"]), 1.0)
    objective = lambda params, micro_batch, rng: _loss_sums(
        params, model, micro_batch, z_loss, total, frozen=state.frozen, adapters=adapters,
        rng=rng)
  grad_fn = jax.grad(objective, has_aux=True)
  step_key = (None if dropout_seed is None
              else jax.random.fold_in(jax.random.key(dropout_seed), state.step))

  if grad_accum_steps == 1:
    grads, sums = grad_fn(state.params, batch, step_key)
  else:
    def accumulate(carry, indexed):
      index, micro_batch = indexed
      key = None if step_key is None else jax.random.fold_in(step_key, index)
      grads, sums = grad_fn(state.params, micro_batch, key)
      return jax.tree.map(jnp.add, carry, (grads, sums)), None

    micro_batches = _split_micro_batches(batch, grad_accum_steps)
    shapes = jax.eval_shape(grad_fn, state.params, jax.tree.map(lambda x: x[0], micro_batches),
                            step_key)
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
    (grads, sums), _ = jax.lax.scan(
        accumulate, zeros, (jnp.arange(grad_accum_steps), micro_batches))

  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  if dpo is not None:
    metrics = {**dpo_lib.metrics(sums), "tokens": jnp.sum(batch["weights"])}
  else:
    metrics = {
        "loss": sums["cross_entropy_sum"] / total,
        "z_loss": sums["z_sum"] / total,
        "accuracy": sums["correct_sum"] / total,
        "tokens": total,
        **model_statistics(sums, total),
    }
  metrics["learning_rate"] = schedule(state.step)
  if log_grad_norm:
    # An extra pass over every gradient (the optimizer's clipping computes its own norm).
    metrics["grad_norm"] = _global_norm(grads, ravel_norm)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: Batch, frozen: Any = None, *, model: nn.Module,
              per_token: bool = False, adapters: bool = False) -> dict[str, jax.Array]:
  """Metric sums over one eval batch; the caller adds them up and divides by `weight_sum`.
  With `per_token`, also each token's weighted cross-entropy [B, T] (`token_nats`), for
  per-document scores. `adapters`, `frozen`: as for `train_step`."""
  _, sums = _loss_sums(params, model, batch, 0.0, per_token=per_token, frozen=frozen,
                       adapters=adapters)
  return {**sums, "weight_sum": jnp.sum(batch["weights"])}


def preference_eval_step(params: Any, batch: Batch, frozen: Any = None, *, model: nn.Module,
                         settings: dpo_lib.DpoSettings, adapters: bool = False
                         ) -> dict[str, jax.Array]:
  """DPO's sums (training/dpo.py) over one batch of preference pairs; the reference is the
  model on `frozen` alone, or, where there is none (a job that is not DPO's), the policy
  itself (every reward 0; the policy's own preference accuracy still says which sequence it
  prefers)."""
  def sequences(logits):
    log_probs = -token_losses(logits, batch["targets"])[0]
    return dpo_lib.sequence_log_probs(log_probs, batch["weights"], batch["segment_ids"])

  policy = sequences(logits_of(model, params, batch, frozen, adapters))
  reference = policy if frozen is None else sequences(reference_logits(model, frozen, batch))
  return dpo_lib.sums(policy, reference[:2], settings)


def is_finite(tree: Any) -> jax.Array:
  """A scalar: whether every float in `tree` (a state: parameters and optimizer moments) is
  finite. Computed where the arrays are, so only one bool crosses to the host."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  if not leaves:
    return jnp.array(True)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
