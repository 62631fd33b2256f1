"""Pure step functions shared by every program: train, eval and AOT compile jit these same
functions with the same shardings, so what compiles is what trains.

No I/O, no flags, no config objects: a step receives the model, the optax transformation,
the objective (a part: training/objectives/) and plain numbers. A batch is a dict of arrays:
  inputs [B, T] int32, targets [B, T] int32, weights [B, T] float32 (0 on padding),
  and optionally segment_ids [B, T] and positions [B, T] for packed examples.

What a step trains is `state.params`: the model's parameters, or (`adapters=True`) a LoRA
model's adapters over the frozen base `state.frozen` (models/lora.py), which gets no gradient.
What it minimizes is the objective's loss (the next-token loss by default); an objective that
needs a reference reads it in `state.frozen` too: the model applied to it alone (a LoRA model
without its adapters, or a full fine-tune's frozen copy).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from lingvo_lite.training.objectives.lm import LanguageModelling
from lingvo_lite.training.objectives.objective import Forward, Objective
from lingvo_lite.training.train_state import TrainState

Batch = dict[str, jax.Array]

# The objective of a step that is given none.
_NEXT_TOKEN = LanguageModelling()


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


def _summed_gradients(grad_fn: Any, params: Any, batch: Batch, step_key: jax.Array | None,
                      grad_accum_steps: int) -> tuple[Any, Any]:
  """`grad_fn(params, batch, key)`'s (gradients, auxiliary outputs), summed over
  `grad_accum_steps` micro-batches of `batch` (each its own dropout key) where more than 1."""
  if grad_accum_steps == 1:
    return grad_fn(params, batch, step_key)

  def accumulate(carry, indexed):
    index, micro_batch = indexed
    key = None if step_key is None else jax.random.fold_in(step_key, index)
    return jax.tree.map(jnp.add, carry, grad_fn(params, micro_batch, key)), None

  micro_batches = _split_micro_batches(batch, grad_accum_steps)
  shapes = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro_batches),
                          step_key)
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
  summed, _ = jax.lax.scan(accumulate, zeros, (jnp.arange(grad_accum_steps), micro_batches))
  return summed


def train_step(state: TrainState, batch: Batch, *, model: nn.Module,
               optimizer: optax.GradientTransformation, schedule: optax.Schedule,
               objective: Objective = _NEXT_TOKEN, z_loss: float = 0.0,
               grad_accum_steps: int = 1, log_grad_norm: bool = True, ravel_norm: bool = True,
               adapters: bool = False, dropout_seed: int | None = None,
               offload_state: bool = False) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update on `objective`'s loss of `batch` (its mean over the batch's tokens,
  or pairs: `objective.normalizer`).

  With `grad_accum_steps` k > 1 the batch is cut into k micro-batches whose gradients are
  summed before the update. Each micro-batch's loss is divided by the normalizer of the whole
  batch, so the update equals the one-big-batch update (up to summation order).
  `z_loss`: train.z_loss, for an objective that adds it. `ravel_norm`: the gradient norm as
  one reduction over the concatenated gradients (fastest on one CPU device; see
  `_global_norm`). `adapters`: `state.params` are LoRA adapters over `state.frozen`;
  `dropout_seed`: the root of their dropout's keys, fold_in(seed, step) (and the micro-batch),
  so a resumed run draws the same masks. `offload_state`: `state.opt_state` lives in host
  memory (the jit's shardings say so: train_state.offloaded); it is brought to the device for
  the update and the new one sent back, so between steps the device holds none of it.
  Then the model moves what it measured (`after_step`: a mixture of experts' selection biases
  by the loads of the step's forward passes, summed over the micro-batches).
  """
  total = objective.normalizer(batch)

  def loss(params, micro_batch, rng):
    loads = []
    forward = Forward(model, state.frozen, adapters, rng, loads)
    value, sums = objective.loss(forward, params, micro_batch, total, z_loss)
    return value, (sums, jax.tree.map(lambda *each: sum(each), *loads) if loads else None)

  step_key = (None if dropout_seed is None
              else jax.random.fold_in(jax.random.key(dropout_seed), state.step))
  grads, (sums, loads) = _summed_gradients(jax.grad(loss, has_aux=True), state.params, batch,
                                           step_key, grad_accum_steps)

  opt_state = state.opt_state
  if offload_state:  # XLA computes only on the device's memory.
    opt_state = jax.device_put(opt_state, jax.memory.Space.Device)
  updates, opt_state = optimizer.update(grads, opt_state, state.params)
  if offload_state:
    opt_state = jax.device_put(opt_state, jax.memory.Space.Host)
  params = optax.apply_updates(state.params, updates)
  if loads is not None and not adapters:  # A LoRA job's base (its biases too) stays frozen.
    params = model.after_step(state.params, params, loads)
  metrics = objective.train_metrics(sums, total, batch)
  metrics["learning_rate"] = schedule(state.step)
  if log_grad_norm:
    # An extra pass over every gradient (the optimizer's clipping computes its own norm).
    metrics["grad_norm"] = _global_norm(grads, ravel_norm)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: Batch, frozen: Any = None, *, model: nn.Module,
              objective: Objective = _NEXT_TOKEN, per_token: bool = False,
              adapters: bool = False) -> dict[str, jax.Array]:
  """`objective`'s sums over one eval batch; the caller adds them up and divides them once
  (`objective.eval_metrics`). With `per_token`, also each token's weighted loss [B, T]
  (`token_nats`), for per-document scores. `adapters`, `frozen`: as for `train_step` (an
  objective with a reference reads `frozen`)."""
  return objective.eval_sums(Forward(model, frozen, adapters), params, batch, per_token)


def is_finite(tree: Any) -> jax.Array:
  """A scalar: whether every float in `tree` (a state: parameters and optimizer moments) is
  finite. Computed where the arrays are, so only one bool crosses to the host."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  if not leaves:
    return jnp.array(True)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
