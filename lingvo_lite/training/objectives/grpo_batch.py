"""A GRPO train batch from scored completions: each completion one row of prompt and answer
tokens, its answer's tokens weighted, with the log-probabilities it was sampled with, its
group's advantage and what the step logs about the rollout.

A row holds the prompt's ids and the completion's ids (its end-of-sequence token too, where it
ended on one, as TRL's completion mask counts it) as one sequence s of at most
sequence_length + 1 tokens; `inputs` is s[:-1] and `targets` s[1:], padded with 0 at the end
(a causal model's earlier positions never see the padding), and `weights` is 1 on the targets
that are the completion's tokens. `old_log_probs` holds, at those positions, each token's
log-probability under the policy that sampled it (decode/steps.py: before temperature and
top-p, the model's own distribution; the objective replaces them by the train step's forward
where several updates divide by them).

The per-row columns (`advantages`, `rewards`, one `reward_<i>` per reward of the objective's
list, `passed`, `zero_variance`, `rollout_seconds`, `reward_failures`: the rewards that failed
and scored 0) are the same in every process's batch
layout, so the train step's metrics average them as it averages the loss.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from lingvo_lite.errors import UsageError
from lingvo_lite.training.objectives import grpo_math

ROW_COLUMNS = ("advantages", "rewards", "passed", "zero_variance", "rollout_seconds",
               "reward_failures")


def reward_column(index: int) -> str:
  """The batch key of the objective's `index`th reward's scores."""
  return f"reward_{index}"


def batch_spec(rows: int, sequence_length: int, rewards: int
               ) -> dict[str, tuple[tuple[int, ...], str]]:
  """The global batch of `rows` completions as {key: (shape, dtype)}."""
  tokens = (rows, sequence_length)
  spec = {"inputs": (tokens, "int32"), "targets": (tokens, "int32"),
          "weights": (tokens, "float32"), "old_log_probs": (tokens, "float32")}
  for key in ROW_COLUMNS + tuple(reward_column(i) for i in range(rewards)):
    spec[key] = ((rows,), "float32")
  return spec


def token_rows(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
               log_probs: Sequence[Sequence[float]], sequence_length: int,
               ids: Sequence[str]) -> dict[str, np.ndarray]:
  """inputs, targets, weights and old_log_probs [rows, sequence_length] (module doc).

  Raises:
    UsageError: a prompt and its completion do not fit sequence_length + 1 tokens (the record's
      id named).
  """
  rows = len(completions)
  inputs = np.zeros((rows, sequence_length), np.int32)
  targets = np.zeros((rows, sequence_length), np.int32)
  weights = np.zeros((rows, sequence_length), np.float32)
  old = np.zeros((rows, sequence_length), np.float32)
  for row, (prompt, answer, answer_log_probs) in enumerate(zip(prompts, completions,
                                                               log_probs)):
    sequence = list(prompt) + list(answer)
    if len(sequence) > sequence_length + 1:
      raise UsageError(
          f"train_data: record {ids[row]!r}: its prompt's {len(prompt)} tokens and a "
          f"completion of {len(answer)} do not fit train_data.sequence_length="
          f"{sequence_length} (+1); raise train_data.sequence_length to at least "
          f"{len(sequence) - 1}, or lower train.objective.max_new_tokens")
    length = len(sequence) - 1
    inputs[row, :length] = sequence[:-1]
    targets[row, :length] = sequence[1:]
    start = len(prompt) - 1  # The target index of the completion's first token.
    weights[row, start:length] = 1.0
    old[row, start:length] = answer_log_probs
  return {"inputs": inputs, "targets": targets, "weights": weights, "old_log_probs": old}


def row_columns(totals: Sequence[float], per_function: Sequence[Sequence[float]],
                group_size: int, advantage_scale: str, rollout_seconds: float
                ) -> dict[str, np.ndarray]:
  """The per-row columns: advantages from the totals by group, the totals, each reward's
  scores (`per_function[i]`: the ith reward's, one per row), whether a row passed (its first
  reward, the task's, reached 1), whether its group's totals are all equal, and the rollout's
  seconds (the same in every row)."""
  totals = np.asarray(totals, np.float32)
  columns = {
      "advantages": grpo_math.group_advantages(totals, group_size, advantage_scale),
      "rewards": totals,
      "passed": (np.asarray(per_function[0], np.float32) >= 1.0).astype(np.float32),
      "zero_variance": grpo_math.zero_variance_groups(totals, group_size),
      "rollout_seconds": np.full(len(totals), rollout_seconds, np.float32)}
  for index, scores in enumerate(per_function):
    columns[reward_column(index)] = np.asarray(scores, np.float32)
  return columns
