"""Language modelling: the next-token cross-entropy over the weighted tokens of documents.

A step's loss is (cross-entropy + z_loss * log(Z)^2) summed over the batch's weighted tokens
and divided by their count, plus the model's auxiliary objective (a mixture of experts'
balance loss: models/family.py's `logits_and_losses`) weighted by each micro-batch's share of
the tokens. Its metrics, in training and evaluation:

  loss            mean next-token cross-entropy in nats over the weighted (non-padding) tokens
  perplexity      exp(loss) (inf past float64's range; evaluation)
  accuracy        fraction of weighted tokens whose target's logit is the largest (ties count)
  bits_per_token  loss / ln 2 (evaluation)
  tokens          weighted tokens
  bytes           UTF-8 bytes of text those tokens stand for (evaluation, sources with
                  `token_bytes`)
  bits_per_byte   total nats / ln 2 / bytes: comparable across vocabularies (bytes vs
                  SentencePiece), since both sides count the same text
  z_loss          mean log(Z)^2 (training)

and the model's statistics by name (a mixture of experts' load and router z-loss), averaged
over the tokens as the loss is. A pass with no weighted token (or text byte) reports NaN for
the means it cannot take.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from lingvo_lite.training.objectives.objective import (DOCUMENTS, Batch, Forward, Objective,
                                                       token_losses)

# The suffix of a model statistic's weighted sum among the metric sums.
STATISTIC_SUM = "__sum"


def model_statistics(sums: Mapping[str, Any], weight: Any) -> dict[str, Any]:
  """The model's statistics (`logits_and_losses`) from their weighted sums, by name."""
  return {name[:-len(STATISTIC_SUM)]: value / weight for name, value in sums.items()
          if name.endswith(STATISTIC_SUM)}


def loss_sums(forward: Forward, params: Any, batch: Batch, z_loss: float,
              normalizer: jax.Array | float = 1.0, per_token: bool = False
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(cross-entropy + z_loss * log(Z)^2) summed over weighted tokens / normalizer, plus the
  model's auxiliary objective weighted by this batch's share of the tokens, and the metric
  sums (with `per_token`, also each token's weighted cross-entropy, `token_nats`). The
  model's statistics are summed weighted by the batch's tokens, so micro-batches and eval
  batches average them as they do the loss."""
  return sums_of_outputs(forward.outputs(params, batch), batch, z_loss, normalizer, per_token)


def sums_of_outputs(outputs: tuple[jax.Array, jax.Array, dict[str, Any]], batch: Batch,
                    z_loss: float, normalizer: jax.Array | float = 1.0, per_token: bool = False
                    ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """`loss_sums` of the model's outputs on `batch` (`Forward.outputs`: its logits, auxiliary
  objective and statistics)."""
  logits, auxiliary, statistics = outputs
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


@dataclasses.dataclass(frozen=True)
class LanguageModelling(Objective):
  """The next-token loss on the weighted tokens (`train.objective`'s default)."""

  rows: ClassVar[str] = DOCUMENTS
  scores_documents: ClassVar[bool] = True
  measures_bytes: ClassVar[bool] = True
  eval_columns: ClassVar[tuple[tuple[str, str], ...]] = (
      ("loss", "loss"), ("perplexity", "perplexity"), ("accuracy", "accuracy"),
      ("bits_per_token", "bits/token"), ("bits_per_byte", "bits/byte"))
  former_name: ClassVar[str] = "lm"
  data_fix: ClassVar[str] = ("give it documents, or train on the pairs with --fiddler=dpo "
                             "(training/objectives/dpo.py)")

  def loss(self, forward: Forward, params: Any, batch: Batch, normalizer: jax.Array | float,
           z_loss: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    return loss_sums(forward, params, batch, z_loss, normalizer)

  def train_metrics(self, sums: dict[str, jax.Array], normalizer: jax.Array, batch: Batch
                    ) -> dict[str, jax.Array]:
    del batch  # The normalizer is its weighted tokens.
    return {
        "loss": sums["cross_entropy_sum"] / normalizer,
        "z_loss": sums["z_sum"] / normalizer,
        "accuracy": sums["correct_sum"] / normalizer,
        "tokens": normalizer,
        **model_statistics(sums, normalizer),
    }

  def eval_sums(self, forward: Forward, params: Any, batch: Batch, per_token: bool = False
                ) -> dict[str, jax.Array]:
    _, sums = loss_sums(forward, params, batch, 0.0, per_token=per_token)
    return {**sums, "weight_sum": jnp.sum(batch["weights"])}

  def eval_metrics(self, totals: Mapping[str, float], text_bytes: float | None
                   ) -> dict[str, float]:
    weight = totals["weight_sum"]
    # A pass without a weighted token (or text byte) has no mean: NaN, not a perfect score.
    loss = totals["cross_entropy_sum"] / weight if weight else math.nan
    metrics = {
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 709.0 else math.inf,  # float64's largest exp.
        "accuracy": totals["correct_sum"] / weight if weight else math.nan,
        "bits_per_token": loss / math.log(2.0),
        "tokens": weight,
        **(model_statistics(totals, weight) if weight else {}),
    }
    if text_bytes is not None:
      metrics["bytes"] = text_bytes
      metrics["bits_per_byte"] = (totals["cross_entropy_sum"] / math.log(2.0) / text_bytes
                                  if text_bytes else math.nan)
    return metrics

  def eval_summary(self, metrics: Mapping[str, float]) -> str:
    return (f"loss {metrics['loss']:.4f}  bits/token {metrics['bits_per_token']:.4f}  "
            + (f"bits/byte {metrics['bits_per_byte']:.4f}  " if "bits_per_byte" in metrics
               else "")
            + f"accuracy {metrics['accuracy']:.4f}")

  def final_summary(self, metrics: Mapping[str, float]) -> str:
    return (f"{metrics['loss']:.4f} ({metrics['bits_per_token']:.4f} bits/token"
            + (f", {metrics['bits_per_byte']:.4f} bits/byte)" if "bits_per_byte" in metrics
               else ")"))
