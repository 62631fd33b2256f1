"""Optimizer settings and the optax chain they build: AdamW, warmup + cosine, clipping."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import jax
import optax

from lingvo_lite.fields import (NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                                Range)

# A moment decay rate of 1 zeroes Adam's bias correction 1 - b**t: every update divides by 0.
_MOMENT_DECAY = Range(0, 1, high_open=True)


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

  # Adam keeps two moments per parameter (mu and nu), each of the parameter's shape and dtype.
  moments_per_parameter = 2

  def schedule(self, total_steps: int) -> optax.Schedule:
    decay_steps = max(self.decay_steps or total_steps, self.warmup_steps + 1)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=self.peak_learning_rate, warmup_steps=self.warmup_steps,
        decay_steps=decay_steps,
        end_value=self.peak_learning_rate * self.final_learning_rate_ratio)

  def make(self, total_steps: int) -> optax.GradientTransformation:
    adamw = optax.adamw(
        self.schedule(total_steps), b1=self.b1, b2=self.b2, eps=self.eps,
        weight_decay=self.weight_decay, mask=decay_mask)
    # The same chain whether clipping is on or off (identity has clipping's empty state),
    # so the optimizer state's tree, and a checkpoint, does not depend on it: a resumed run
    # may turn clipping on to recover from a divergence.
    clip = (optax.clip_by_global_norm(self.clip_grad_norm) if self.clip_grad_norm
            else optax.identity())
    return optax.chain(clip, adamw)
