"""Optimizer settings and the optax chain they build: AdamW, warmup + cosine, clipping; where
its moments are kept (their dtype, and device or host memory between steps)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

import jax
import jax.numpy as jnp
import optax

from lingvo_lite import target as targets
from lingvo_lite.errors import config_error
from lingvo_lite.fields import (NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                                Range)

# A moment decay rate of 1 zeroes Adam's bias correction 1 - b**t: every update divides by 0.
_MOMENT_DECAY = Range(0, 1, high_open=True)
MomentDType = Literal["float32", "bfloat16"]


def decay_mask(params: Any) -> Any:
  """True for matrices (ndim >= 2): norms' scales and biases are not decayed."""
  return jax.tree.map(lambda p: len(p.shape) >= 2, params)


@dataclasses.dataclass(frozen=True)
class AdamW:
  """AdamW with linear warmup, cosine decay and global-norm clipping (the GPT-3 recipe).

  Attributes:
    peak_learning_rate: Learning rate at the end of warmup.
    warmup_steps: Linear warmup from 0 to the peak.
    decay_steps: Steps of warmup plus cosine decay; None means the run's `train.steps`.
    final_learning_rate_ratio: The cosine ends at peak * this ratio.
    b1, b2, eps: Adam moments' decay rates and epsilon.
    weight_decay: Decoupled weight decay, applied to matrices only.
    clip_grad_norm: Global-norm clipping threshold; None or 0 disables it.
    moment_dtype: The dtype both Adam moments (mu and nu) are stored in; None keeps the
      parameters' dtype. The update is computed in float32 whatever it is: the stored moments
      are upcast, updated and rounded back (to nearest). "bfloat16" halves the moments'
      bytes (MaxText's adam_mu_dtype, for both moments). A resumed run keeps its job's
      moment dtype (its checkpoint holds them).
    offload_state: Keep the optimizer state (the moments) in the host's pinned memory
      between steps; each step brings it to the device for the update and sends it back
      (MaxText's optimizer_memory_host_offload). The device then holds only the parameters,
      gradients and activations. TPUs and GPUs only: a CPU has no memory apart from the
      host's. A resumed run may change it.
  """

  peak_learning_rate: PositiveFloat = 3e-4
  warmup_steps: NonNegativeInt = 100
  decay_steps: PositiveInt | None = None
  final_learning_rate_ratio: Annotated[float, Range(0, 1)] = 0.1
  b1: Annotated[float, _MOMENT_DECAY] = 0.9
  b2: Annotated[float, _MOMENT_DECAY] = 0.95
  eps: PositiveFloat = 1e-8
  weight_decay: NonNegativeFloat = 0.1
  clip_grad_norm: NonNegativeFloat | None = 1.0
  moment_dtype: MomentDType | None = None
  offload_state: bool = False

  # Adam keeps two moments per parameter (mu and nu), each of the parameter's shape.
  moments_per_parameter = 2

  def moment_itemsize(self, parameter_dtype: Any) -> int:
    """Bytes of one moment's element for a parameter of `parameter_dtype`."""
    return jnp.dtype(self.moment_dtype or parameter_dtype).itemsize

  def validate(self, target: targets.Target, path: str = "optimizer") -> None:
    """Raises UsageError where `target` cannot hold the state as asked."""
    if self.offload_state and target.platform == "cpu":
      raise config_error(f"{path}.offload_state", self.offload_state,
                         "moves the optimizer state to host memory, which a CPU target does "
                         "not have apart from its own", f"set {path}.offload_state=False on a "
                         "CPU (or moment_dtype='bfloat16' to halve the moments)")

  def schedule(self, total_steps: int) -> optax.Schedule:
    decay_steps = max(self.decay_steps or total_steps, self.warmup_steps + 1)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=self.peak_learning_rate, warmup_steps=self.warmup_steps,
        decay_steps=decay_steps,
        end_value=self.peak_learning_rate * self.final_learning_rate_ratio)

  def make(self, total_steps: int) -> optax.GradientTransformation:
    schedule = self.schedule(total_steps)
    if self.moment_dtype is None:
      adamw = optax.adamw(schedule, b1=self.b1, b2=self.b2, eps=self.eps,
                          weight_decay=self.weight_decay, mask=decay_mask)
    else:  # optax.adamw's own chain, its Adam's moments stored in moment_dtype.
      adam = optax.scale_by_adam(b1=self.b1, b2=self.b2, eps=self.eps)
      adamw = optax.chain(stored_in(jnp.dtype(self.moment_dtype), adam),
                          optax.add_decayed_weights(self.weight_decay, decay_mask),
                          optax.scale_by_learning_rate(schedule))
    # The same chain whether clipping is on or off (identity has clipping's empty state),
    # so the optimizer state's tree, and a checkpoint, does not depend on it: a resumed run
    # may turn clipping on to recover from a divergence.
    clip = (optax.clip_by_global_norm(self.clip_grad_norm) if self.clip_grad_norm
            else optax.identity())
    return optax.chain(clip, adamw)


def stored_in(dtype: Any, adam: optax.GradientTransformation) -> optax.GradientTransformation:
  """`adam` (optax.scale_by_adam) with both moments stored in `dtype`, updated in float32.

  optax's own `mu_dtype` stores the first moment only, and computes in the promoted dtype of
  the stored moment and the gradient (bfloat16 for a bfloat16 model). Here the moments and the
  gradients are upcast before optax's update runs and the moments rounded to nearest after
  it, so the update is optax's float32 one and only the stored moments lose precision (the
  update, float32, is cast to each parameter's dtype where it is applied): the same tree
  (ScaleByAdamState: count, mu, nu) as optax.adamw's, only its moments' dtype differs.
  """
  compute = jnp.promote_types(dtype, jnp.float32)

  def cast(state: optax.ScaleByAdamState, to: Any) -> optax.ScaleByAdamState:
    moments = jax.tree.map(lambda m: m.astype(to), (state.mu, state.nu))
    return state._replace(mu=moments[0], nu=moments[1])

  def init(params: Any) -> optax.ScaleByAdamState:
    return cast(adam.init(params), dtype)

  def update(updates: Any, state: optax.ScaleByAdamState, params: Any = None
             ) -> tuple[Any, optax.ScaleByAdamState]:
    updates = jax.tree.map(lambda g: g.astype(compute), updates)
    updates, state = adam.update(updates, cast(state, compute), params)
    return updates, cast(state, dtype)

  return optax.GradientTransformation(init, update)
