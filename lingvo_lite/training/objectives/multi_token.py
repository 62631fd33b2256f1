"""Multi-token prediction (DeepSeek-V3, section 2.2) as a training objective: the next-token
loss plus `weight` / D x the sum over the model's D multi-token modules (models/multi_token.py)
of their cross-entropy, module k predicting token i + k + 1 at position i.

Module k's target at position i is targets[i + k] (= token i + k + 1), weighed by that
target's weight where position i + k is in the same document as position i (a packed row's
next document, and the positions past the row, are not scored). Its cross-entropy is summed
over those positions and divided by the batch's weighted tokens, as the next-token loss is
(so micro-batches add up to the batch's loss; the paper's mean over the scored positions
differs by their share of the tokens, 1 - k / length for unpacked rows).

Metrics: the language-modelling ones (`loss` is the next-token loss alone, comparable with a
job without this objective), and `multi_token_loss`, the modules' mean cross-entropy over
their scored positions. Evaluation, decoding and serving use the next-token logits alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from lingvo_lite.errors import config_error
from lingvo_lite.fields import NonNegativeFloat
from lingvo_lite.models.multi_token import ahead
from lingvo_lite.training.objectives import lm
from lingvo_lite.training.objectives.objective import Batch, Forward, Plotted, token_losses


def depth_targets(batch: Batch, k: int) -> tuple[jax.Array, jax.Array]:
  """(targets, weights) [B, T] of module k (the module doc): targets[i + k], its weight where
  position i + k is in position i's document, else 0."""
  weights = ahead(batch["weights"].astype(jnp.float32), k, 0.0)
  segment_ids = batch.get("segment_ids")
  if segment_ids is not None:
    weights = weights * (ahead(segment_ids, k, -1) == segment_ids)
  return ahead(batch["targets"], k), weights


@dataclasses.dataclass(frozen=True)
class MultiTokenPrediction(lm.LanguageModelling):
  """The next-token loss plus the multi-token modules' (the module doc).

  Attributes:
    weight: lambda, the modules' summed loss's weight over their count (DeepSeek-V3: 0.3 for
      its first 10T tokens, then 0.1).
  """

  weight: NonNegativeFloat = 0.3

  former_name: ClassVar[str | None] = None
  plots: ClassVar[tuple[Plotted, ...]] = (
      Plotted("multi_token_loss", "multi-token prediction loss", "nats", evals=False),)

  def __repr__(self) -> str:
    return f"MultiTokenPrediction(weight={self.weight!r})"

  def check_model(self, path: str, model: Any) -> None:
    if not getattr(model, "multi_token_depth", lambda: 0)():
      raise config_error(path, self, f"trains multi-token modules, and the model (a "
                         f"{type(model).__name__}) has none", "set model.multi_token_layers "
                         "(1, as DeepSeek-V3) on a mixture-of-experts family, or train with "
                         "LanguageModelling")

  def loss(self, forward: Forward, params: Any, batch: Batch, normalizer: jax.Array | float,
           z_loss: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    (logits, ahead_logits), auxiliary, statistics = forward.outputs(params, batch, True)
    objective, sums = lm.sums_of_outputs((logits, auxiliary, statistics), batch, z_loss,
                                         normalizer)
    depth = ahead_logits.shape[0]
    cross_entropy_sum = weight_sum = 0.0
    for k in range(1, depth + 1):
      targets, weights = depth_targets(batch, k)
      cross_entropy = token_losses(ahead_logits[k - 1], targets)[0]
      cross_entropy_sum += jnp.sum(cross_entropy * weights)
      weight_sum += jnp.sum(weights)
    objective = objective + self.weight / depth * cross_entropy_sum / normalizer
    return objective, {**sums, "multi_token_sum": cross_entropy_sum,
                       "multi_token_weight_sum": weight_sum}

  def step_bytes(self, logits_bytes: int) -> int:
    """One module's logits beside the main pass's (DeepSeek-V3's one; a model of D holds D:
    the objective does not know D, the compile report's verdict is a lower bound)."""
    return logits_bytes

  def train_metrics(self, sums: dict[str, jax.Array], normalizer: jax.Array, batch: Batch
                    ) -> dict[str, jax.Array]:
    metrics = super().train_metrics(sums, normalizer, batch)
    metrics["multi_token_loss"] = (sums["multi_token_sum"]
                                   / jnp.maximum(sums["multi_token_weight_sum"], 1.0))
    return metrics
