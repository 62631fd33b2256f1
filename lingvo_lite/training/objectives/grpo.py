"""GRPO (group relative policy optimization: DeepSeekMath, DeepSeek-R1) and its published
variants as a training objective: reinforcement learning from verifiable rewards on the
policy's own completions.

Each train step's rows come from the policy itself (`training_batch`): for the train data's
prompt records (data/prompt_source.py over a data/prompt_data.py set), G completions each,
sampled in-process from the current parameters through the decode engine
(on_mesh/rollouts.py), scored by the registered rewards
`rewards` names with their weights (rewards/), and turned into one row per completion with its
group's advantage (grpo_batch.py). The loss is grpo_math.py's: the clipped surrogate with token
or sequence (GSPO) ratios, DAPO's two epsilons, the k3 KL to the frozen reference (the model as
it started; none is held at kl_coef 0), aggregated per sequence (GRPO), per token (DAPO) or
over a constant length (Dr. GRPO), with advantages scaled by the group's std (GRPO) or not
(Dr. GRPO). `--fiddler=grpo` sets it; its fields follow as `--fdl.train.objective.FIELD=`.

Several updates on one batch of rollouts (`updates_per_batch` = mu): rollout r is sampled at
step r * mu from that step's prompts and trained on for mu steps, the ratio's denominator the
log-probabilities of the policy that sampled it, by the train step's own forward (as TRL
computes them: decoding's own are the same model's, tests/test_grpo.py checks, but a QLoRA
job decodes its merged weights quantized again); with mu = 1 the ratio is
exp(log pi - stop_gradient(log pi)) (1, as TRL's when old and current policy are one).

Every save falls on a rollout's first step (train.steps and checkpoint.every_steps are
multiples of mu, checked; a signal's stop waits for the rollout's last update,
`can_stop_after`), so a resumed run samples rollout r again from the same parameters with the
same seeds (`train.seed`, the rollout, the row): exactly what the uninterrupted run sampled.

Logged per step: loss, kl (mean k3 per completion token), clip_fraction (tokens whose clip is
active), entropy (nats per completion token), response_length (completion tokens per row),
reward_mean and reward_std (of the weighted totals), `reward:<name>` (each reward's mean
score), pass_rate (rows whose first reward, the task's, reached 1), zero_variance (the share of
groups whose rewards are all equal: no gradient from them), rollout_s (the seconds the step
spent sampling and scoring; the rest of its time is training).

Log-probabilities are the model's own (temperature 1), as the decode engine reports a sampled
token's: the temperature and top-p shape which completions are drawn, not what the ratio reads.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Annotated, Any, ClassVar, Literal, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from lingvo_lite.errors import UsageError, config_error
from lingvo_lite.rewards import registry
from lingvo_lite.fields import NonNegativeFloat, PositiveFloat, PositiveInt, Range
from lingvo_lite.training.objectives import grpo_batch, grpo_math
from lingvo_lite.training.objectives.objective import (PROMPTS, Batch, Forward, Objective,
                                                       Plotted, token_losses)

_OPEN_UNIT = Range(0, 1, low_open=True, high_open=True)


@dataclasses.dataclass(frozen=True)
class Grpo(Objective):
  """GRPO on the policy's completions of the train data's prompts (module doc).

  Attributes:
    rewards: (name, weight) of each registered reward (rewards/registry.py) the total sums;
      the first is the task's (pass_rate counts its scores of 1).
    group_size: G, completions sampled per prompt (a group's advantages compare them).
    max_new_tokens: The longest completion, in tokens.
    temperature: The sampling temperature of the rollouts (> 0: a group must differ).
    top_p: Nucleus sampling of the rollouts (1: off).
    epsilon_low: The clip's lower side, 1 - epsilon_low.
    epsilon_high: The clip's upper side, 1 + epsilon_high (above epsilon_low: DAPO's
      "clip higher").
    updates_per_batch: Optimizer steps on each batch of rollouts (mu).
    kl_coef: beta, the weight of the k3 KL to the reference (0: no reference is held).
    advantage_scale: "group": (r - mean) / (std + 1e-4) per group (GRPO); "mean": r - mean
      (Dr. GRPO).
    aggregation: "sequence" (GRPO), "token" (DAPO) or "constant" (Dr. GRPO): grpo_math.py.
    importance: "token" (GRPO) or "sequence" (GSPO) ratios.
  """

  rewards: tuple[tuple[str, float], ...] = (("exact_answer", 1.0),)
  group_size: Annotated[int, Range(2, note="a group compares its completions")] = 8
  max_new_tokens: PositiveInt = 128
  temperature: PositiveFloat = 1.0
  top_p: Annotated[float, Range(0, 1, low_open=True)] = 1.0
  epsilon_low: Annotated[float, _OPEN_UNIT] = 0.2
  epsilon_high: Annotated[float, _OPEN_UNIT] = 0.2
  updates_per_batch: PositiveInt = 1
  kl_coef: NonNegativeFloat = 0.0
  advantage_scale: Literal["group", "mean"] = "group"
  aggregation: Literal["sequence", "token", "constant"] = "sequence"
  importance: Literal["token", "sequence"] = "token"

  rows: ClassVar[str] = PROMPTS
  eval_columns: ClassVar[tuple[tuple[str, str], ...]] = ()
  plots: ClassVar[tuple[Plotted, ...]] = (
      Plotted("reward_mean", "GRPO reward", "mean total reward", evals=False),
      # One plot per reward function (the report expands the `*`).
      Plotted("reward:*", "GRPO reward", "mean score", evals=False),
      Plotted("pass_rate", "GRPO pass rate", "completions passing", evals=False),
      Plotted("kl", "GRPO KL to the reference", "k3 per token", evals=False),
      Plotted("clip_fraction", "GRPO clip fraction", "tokens clipped", evals=False),
      Plotted("entropy", "GRPO policy entropy", "nats per token", evals=False),
      Plotted("response_length", "GRPO response length", "tokens", evals=False),
      Plotted("zero_variance", "GRPO groups with zero variance", "share", evals=False),
      Plotted("rollout_s", "GRPO rollout time per step", "seconds", evals=False))
  data_fix: ClassVar[str] = ("give a PromptSource (data/prompt_source.py) of a prompt set, or "
                             "another train.objective")

  def __post_init__(self):
    if isinstance(self.rewards, list):  # As a command line or config.json may give it.
      object.__setattr__(self, "rewards", tuple(
          tuple(entry) if isinstance(entry, list) else entry for entry in self.rewards))

  @property
  def needs_reference(self) -> bool:
    return self.kl_coef > 0

  def check(self, path: str, train_data: Any) -> None:
    super().check(path, train_data)
    check_rewards(f"{path}.rewards", self.rewards)

  def check_setup(self, path: str, setup: Any) -> None:
    """The rollouts fit the decode cache and the train rows; every save and the last step
    fall on a rollout's first step (exact resumption)."""
    cache = setup.decode.resolved_cache_length(setup.model.max_length)
    if self.max_new_tokens > cache - 1:
      raise config_error(f"{path}.max_new_tokens", self.max_new_tokens,
                         f"leaves no position for a prompt's tokens in the decode cache "
                         f"(decode.cache_length={cache})", f"use at most {cache - 1}")
    length = setup.train_data.sequence_length
    if self.max_new_tokens > length:
      raise config_error(f"{path}.max_new_tokens", self.max_new_tokens,
                         f"exceeds the train rows (train_data.sequence_length={length})",
                         f"use at most {length}, or raise train_data.sequence_length")
    mu = self.updates_per_batch
    for where, steps in (("train.steps", setup.train.steps),
                         ("checkpoint.every_steps", setup.checkpoint.every_steps)):
      if steps % mu:
        raise config_error(f"{path}.updates_per_batch", mu, f"does not divide {where}="
                           f"{steps} (a save must fall on a rollout's first step)",
                           f"use a divisor of {where}, or change {where}")

  def scores(self, source: Any) -> bool:
    del source  # Its rows are sampled, not read: an eval set is scored by another objective.
    return False

  # ---------------------------------------------------------------------------- the batch

  def training_batch_spec(self, train_data: Any) -> Mapping[str, tuple[tuple[int, ...], str]]:
    """G rows per prompt of the data's global batch, each of its sequence_length."""
    return grpo_batch.batch_spec(train_data.global_batch_size * self.group_size,
                                 train_data.sequence_length, len(self.rewards))

  def training_batch(self, batch: Mapping[str, Any], state: Any, steps: Any
                     ) -> Mapping[str, Any]:
    """The rows of rollout step // updates_per_batch: sampled and scored at its first step,
    the same rows (with no rollout time) at the others."""
    rollouts = steps.rollouts
    step = int(state.step)
    key = (self, step // self.updates_per_batch)
    if rollouts.memo is not None and rollouts.memo[0] == key:
      return {**rollouts.memo[1], "rollout_seconds": rollouts.memo[1]["rollout_seconds"] * 0}
    made = rollout_batch(self, batch, state, steps, key[1])
    rollouts.memo = (key, made) if self.updates_per_batch > 1 else None
    return made

  # ---------------------------------------------------------------------------- a train step

  def normalizer(self, batch: Batch) -> jax.Array:
    return grpo_math.normalizer(batch["weights"], self.aggregation, self.max_new_tokens)

  def loss(self, forward: Forward, params: Any, batch: Batch, normalizer: jax.Array | float,
           z_loss: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The GRPO loss of these rows / normalizer, and its metric sums (no z-loss: the clip and
    the reference keep the policy near where it sampled)."""
    del z_loss
    mask = batch["weights"]
    logits = forward.logits(params, batch)
    log_probs = -token_losses(logits, batch["targets"])[0]
    old = (jax.lax.stop_gradient(log_probs) if self.updates_per_batch == 1
           else batch["old_log_probs"])
    reference = None
    if self.kl_coef:
      reference = -token_losses(forward.reference_logits(batch), batch["targets"])[0]
    terms = grpo_math.token_terms(
        log_probs, old, reference, batch["advantages"], mask, epsilon_low=self.epsilon_low,
        epsilon_high=self.epsilon_high, kl_coef=self.kl_coef, importance=self.importance)
    total = grpo_math.loss_sum(terms.loss, mask, self.aggregation)
    masked = lambda x: jnp.sum(x * mask)
    sums = {"policy_loss_sum": jax.lax.stop_gradient(total), "kl_sum": masked(terms.kl),
            "clipped_sum": masked(terms.clipped),
            "entropy_sum": masked(grpo_math.entropy(logits)), "completion_tokens": jnp.sum(mask)}
    return total / normalizer, sums

  def train_metrics(self, sums: dict[str, jax.Array], normalizer: jax.Array, batch: Batch
                    ) -> dict[str, jax.Array]:
    tokens = jnp.maximum(sums["completion_tokens"], 1.0)
    rewards = batch["rewards"]
    metrics = {
        "loss": sums["policy_loss_sum"] / normalizer, "kl": sums["kl_sum"] / tokens,
        "clip_fraction": sums["clipped_sum"] / tokens, "entropy": sums["entropy_sum"] / tokens,
        "tokens": sums["completion_tokens"],
        "response_length": sums["completion_tokens"] / rewards.shape[0],
        "reward_mean": jnp.mean(rewards), "reward_std": jnp.std(rewards),
        "pass_rate": jnp.mean(batch["passed"]),
        "zero_variance": jnp.mean(batch["zero_variance"]),
        "rollout_s": jnp.mean(batch["rollout_seconds"]),
        "reward_failures": jnp.sum(batch["reward_failures"])}
    for index, (name, _) in enumerate(self.rewards):
      metrics[f"reward:{name}"] = jnp.mean(batch[grpo_batch.reward_column(index)])
    return metrics

  def can_stop_after(self, step: int) -> bool:
    """Only after a rollout's last update: the next step samples anew."""
    return step % self.updates_per_batch == 0

  def train_summary(self, metrics: Mapping[str, float]) -> str:
    return (f"reward {metrics['reward_mean']:.3f}  pass {metrics['pass_rate']:.3f}  "
            f"kl {metrics['kl']:.4f}  clip {metrics['clip_fraction']:.3f}  "
            f"length {metrics['response_length']:.1f}  rollout {metrics['rollout_s']:.1f} s  ")

  # ---------------------------------------------------------------------------- evaluation

  def eval_sums(self, forward: Forward, params: Any, batch: Batch, per_token: bool = False
                ) -> dict[str, jax.Array]:
    raise UsageError("eval_data: GRPO scores no eval set of its own (its rows are sampled); "
                     "give eval sets of documents or preference pairs, or measure accuracy "
                     "with --mode=decode")

  def eval_metrics(self, totals: Mapping[str, float], text_bytes: float | None
                   ) -> dict[str, float]:
    return {"loss": math.nan}

  def step_bytes(self, logits_bytes: int) -> int:
    # The entropy's float32 log-softmax beside the logits; the reference's logits at kl > 0.
    return logits_bytes * (2 if self.kl_coef else 1)


def check_rewards(path: str, rewards: Any) -> None:
  """Each of `rewards` is a (name, finite weight) of a registered reward, each name once,
  and there is one (rewards/registry.py's `check`, naming `path[i]`)."""
  registry.check(rewards, path)


def rollout_batch(objective: Grpo, batch: Mapping[str, Any], state: Any, steps: Any,
                  rollout: int) -> dict[str, Any]:
  """Samples G completions of each of the batch's prompt records from `state`, scores them,
  and lays them out as the train rows (grpo_batch.py), timed."""
  started = time.perf_counter()
  rollouts = steps.rollouts
  records = rollouts.records(batch)
  sampling = rollouts.sampling(objective.group_size, objective.max_new_tokens,
                               objective.temperature, objective.top_p, steps.setup.train.seed)
  completions = rollouts.complete(state, records, sampling, rollout)
  group = objective.group_size
  owners = [records[row // group] for row in range(len(completions))]
  scored = rollouts.score_all(objective.rewards, owners,
                              [rollouts.text(completion) for completion in completions])
  rows = grpo_batch.token_rows(
      [c.prompt_ids for c in completions], [c.completion_ids for c in completions],
      [c.logprobs for c in completions], steps.setup.train_data.sequence_length,
      [str(owner.get("id")) for owner in owners])
  if objective.updates_per_batch > 1:  # The ratio's denominators: the train step's forward.
    rows["old_log_probs"] = rollouts.log_probs(state, rows) * rows["weights"]
  per_function = [[s.per_function.get(name, 0.0) for s in scored]
                  for name, _ in objective.rewards]
  columns = grpo_batch.row_columns([s.total for s in scored], per_function, group,
                                   objective.advantage_scale, time.perf_counter() - started)
  columns["reward_failures"] = np.asarray([len(s.failures) for s in scored], np.float32)
  return {**rows, **columns}
