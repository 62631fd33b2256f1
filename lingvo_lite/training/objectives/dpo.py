"""Direct preference optimization (Rafailov et al. 2023) as a training objective: the loss, its
rewards, and how a packed batch of preference pairs is read.

For a pair (x, y_w, y_l), the policy pi and the frozen reference pi_ref,

  chosen reward    r_w = beta * (log pi(y_w | x) - log pi_ref(y_w | x))
  rejected reward  r_l = beta * (log pi(y_l | x) - log pi_ref(y_l | x))
  loss             -(1 - e) log sigmoid(r_w - r_l) - e log sigmoid(r_l - r_w)

with e the label smoothing (0: the paper's loss; e > 0: the "conservative" DPO of its
appendix, for labels flipped with probability e). log pi(y | x) is the sum of the response
tokens' log-probabilities: the tokens whose loss weight is 1 (the assistant's, and its
end-of-turn token, as the chat format marks them).

A batch of pairs is packed as the preference source writes it (data/preference_data.py): each
row holds whole pairs, the chosen sequence as one segment and the rejected as the next, so
segment 2p + 1 of a row is pair p's chosen and 2p + 2 its rejected (segment ids count from 1;
0 is padding). Per-sequence sums are one scatter-add over the batch's tokens.

A step's loss is the mean over the batch's pairs; its metrics, in training and evaluation:

  loss                 the DPO loss, per pair
  reward_chosen        mean chosen reward; reward_rejected: mean rejected reward
  reward_margin        their difference
  reward_accuracy      fraction of pairs whose chosen reward is the larger
  preference_accuracy  fraction of pairs the policy itself prefers rightly (log pi(y_w) >
                       log pi(y_l))
  pairs                pairs counted; tokens: the scored (response) tokens

An eval set of pairs in a job without a reference (a full fine-tune of the next-token loss)
is scored against the policy itself: every reward is 0 and only the preference accuracy says
anything.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from lingvo_lite.fields import PositiveFloat, Range
from lingvo_lite.training.objectives.objective import (PAIRS, Batch, Forward, Objective,
                                                       Plotted, token_losses)


def sequence_log_probs(token_log_probs: jax.Array, weights: jax.Array, segment_ids: jax.Array
                       ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(chosen, rejected, present), each [rows, pairs]: the summed weighted log-probabilities of
  each pair's chosen and rejected sequence, and whether the pair is in the row.

  Args:
    token_log_probs: float32 [rows, length]: each target's log-probability.
    weights: [rows, length]: 1 on the response tokens, 0 elsewhere (padding included).
    segment_ids: int32 [rows, length]: 2p + 1 for pair p's chosen, 2p + 2 its rejected, 0
      padding.
  """
  rows, length = segment_ids.shape
  pairs = length // 2
  segments = 2 * pairs + 1  # Ids 0 .. 2 * pairs.
  flat = (jnp.arange(rows)[:, None] * segments + jnp.minimum(segment_ids, 2 * pairs)).reshape(-1)
  sums = jax.ops.segment_sum((token_log_probs * weights).reshape(-1), flat, rows * segments)
  # A sequence is present when it has a weighted token (an eval pass weighs the rows past its
  # split's end 0, which drops their pairs).
  counts = jax.ops.segment_sum((weights > 0).astype(jnp.float32).reshape(-1), flat,
                               rows * segments)
  sums, counts = sums.reshape(rows, segments), counts.reshape(rows, segments)
  chosen, rejected = sums[:, 1::2], sums[:, 2::2]
  present = (counts[:, 1::2] > 0) & (counts[:, 2::2] > 0)
  return chosen, rejected, present


def pair_count(segment_ids: jax.Array) -> jax.Array:
  """The pairs in a batch: the number of chosen segments that start in it (odd ids)."""
  starts = jnp.concatenate([segment_ids[:, :1] != 0,
                            segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
  return jnp.sum(starts & (segment_ids % 2 == 1)).astype(jnp.float32)


def losses(policy_chosen: jax.Array, policy_rejected: jax.Array, reference_chosen: jax.Array,
           reference_rejected: jax.Array, settings: Dpo
           ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(loss, chosen reward, rejected reward) per pair, from the four sequence log-probs."""
  chosen_reward = settings.beta * (policy_chosen - reference_chosen)
  rejected_reward = settings.beta * (policy_rejected - reference_rejected)
  margin = chosen_reward - rejected_reward
  smoothing = settings.label_smoothing
  loss = -(1.0 - smoothing) * jax.nn.log_sigmoid(margin) - smoothing * jax.nn.log_sigmoid(-margin)
  return loss, chosen_reward, rejected_reward


def sums(policy: tuple[jax.Array, jax.Array, jax.Array], reference: tuple[jax.Array, jax.Array],
         settings: Dpo) -> dict[str, jax.Array]:
  """The batch's sums over its pairs (the caller divides by `pairs`): the loss, the rewards,
  the margin, the reward accuracy (chosen reward > rejected), and the policy's own preference
  (log pi(y_w) > log pi(y_l))."""
  chosen, rejected, present = policy
  loss, chosen_reward, rejected_reward = losses(chosen, rejected, *reference, settings)
  mask = present.astype(jnp.float32)
  total = lambda x: jnp.sum(x * mask)
  return {"dpo_loss_sum": total(loss), "chosen_reward_sum": total(chosen_reward),
          "rejected_reward_sum": total(rejected_reward),
          "reward_accuracy_sum": total((chosen_reward > rejected_reward).astype(jnp.float32)),
          "preference_accuracy_sum": total((chosen > rejected).astype(jnp.float32)),
          "pairs": jnp.sum(mask)}


def pair_metrics(totals: dict[str, float | jax.Array]) -> dict[str, float | jax.Array]:
  """The means `sums` (added up over batches) give: the loss, the rewards and their margin,
  the reward accuracy, the policy's preference accuracy, and the pair count."""
  pairs = totals["pairs"]
  safe = jnp.maximum(pairs, 1.0) if isinstance(pairs, jax.Array) else max(pairs, 1.0)
  chosen, rejected = totals["chosen_reward_sum"] / safe, totals["rejected_reward_sum"] / safe
  return {"loss": totals["dpo_loss_sum"] / safe, "reward_chosen": chosen,
          "reward_rejected": rejected, "reward_margin": chosen - rejected,
          "reward_accuracy": totals["reward_accuracy_sum"] / safe,
          "preference_accuracy": totals["preference_accuracy_sum"] / safe, "pairs": pairs}


def _sequences(logits: jax.Array, batch: Batch) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`sequence_log_probs` of the targets under `logits`."""
  log_probs = -token_losses(logits, batch["targets"])[0]
  return sequence_log_probs(log_probs, batch["weights"], batch["segment_ids"])


@dataclasses.dataclass(frozen=True)
class Dpo(Objective):
  """DPO on the train data's preference pairs, against the frozen reference: the base with
  adapters off (LoRA), else a frozen copy of the starting parameters
  (`train.objective = fdl.Config(Dpo, beta=0.1)`, or `--fiddler=dpo`).

  Attributes:
    beta: The strength of the reference: the rewards' scale (the paper's beta).
    label_smoothing: The probability that a pair's labels are flipped (0: plain DPO).
  """

  beta: PositiveFloat = 0.1
  label_smoothing: Annotated[float, Range(0, 0.5, high_open=True)] = 0.0

  rows: ClassVar[str] = PAIRS
  eval_columns: ClassVar[tuple[tuple[str, str], ...]] = (
      ("loss", "loss"), ("reward_margin", "margin"), ("reward_accuracy", "reward acc."),
      ("preference_accuracy", "pref. acc."))
  plots: ClassVar[tuple[Plotted, ...]] = (
      # The chosen reward minus the rejected, and how often it is positive.
      Plotted("reward_margin", "DPO reward margin", "chosen - rejected reward"),
      Plotted("reward_accuracy", "DPO reward accuracy", "pairs with chosen reward > rejected"))
  former_name: ClassVar[str] = "dpo"
  data_fix: ClassVar[str] = ("give a PreferenceStoreData of a store built with "
                             "bin/build_store.py --format=preference, or leave train.objective "
                             "the next-token loss (LanguageModelling)")

  @property
  def needs_reference(self) -> bool:
    return True

  def normalizer(self, batch: Batch) -> jax.Array:
    return jnp.maximum(pair_count(batch["segment_ids"]), 1.0)

  def loss(self, forward: Forward, params: Any, batch: Batch, normalizer: jax.Array | float,
           z_loss: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DPO's loss summed over the micro-batch's pairs / normalizer, and its sums (no z-loss:
    the reference, not log(Z), keeps the policy's logits in place)."""
    del z_loss
    policy = _sequences(forward.logits(params, batch), batch)
    reference = _sequences(forward.reference_logits(batch), batch)[:2]
    totals = sums(policy, reference, self)
    return totals["dpo_loss_sum"] / normalizer, totals

  def train_metrics(self, sums: dict[str, jax.Array], normalizer: jax.Array, batch: Batch
                    ) -> dict[str, jax.Array]:
    del normalizer  # The means divide by the pairs the sums counted.
    return {**pair_metrics(sums), "tokens": jnp.sum(batch["weights"])}

  def eval_sums(self, forward: Forward, params: Any, batch: Batch, per_token: bool = False
                ) -> dict[str, jax.Array]:
    """DPO's sums over one batch of pairs against the reference, or where a job has none,
    against the policy itself; and the scored tokens (`weight_sum`)."""
    del per_token  # A pair's loss is not a sum over its tokens.
    policy = _sequences(forward.logits(params, batch), batch)
    reference = (policy if forward.frozen is None
                 else _sequences(forward.reference_logits(batch), batch))
    return {**sums(policy, reference[:2], self), "weight_sum": jnp.sum(batch["weights"])}

  def eval_metrics(self, totals: Mapping[str, float], text_bytes: float | None
                   ) -> dict[str, float]:
    del text_bytes
    found = {key: float(value) for key, value in pair_metrics(totals).items()}
    if not totals["pairs"]:  # No pair: no mean, NaN rather than a perfect score.
      found = {key: (math.nan if key != "pairs" else 0.0) for key in found}
    found["tokens"] = totals["weight_sum"]
    return found

  def eval_summary(self, metrics: Mapping[str, float]) -> str:
    return (f"DPO loss {metrics['loss']:.4f}  reward margin {metrics['reward_margin']:.4f}  "
            f"reward accuracy {metrics['reward_accuracy']:.4f}  preference accuracy "
            f"{metrics['preference_accuracy']:.4f} ({metrics['pairs']:,.0f} pairs)")

  def step_bytes(self, logits_bytes: int) -> int:
    return logits_bytes  # The reference's logits beside the policy's.
