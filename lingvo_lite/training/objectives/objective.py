"""What a training objective is: the part `train.objective` holds, and what a step hands it.

An objective is a config part (a frozen dataclass subclassing `Objective`, its settings as
fields declared with their constraints through lingvo_lite/fields.py) that says everything a
program needs to know about it, so that the train step, the jitted programs, evaluation, the
compile program and the report take the part and never ask for its name:

  what it reads      `rows` (the kind of rows of the train data, checked by `check` in
                     `Setup.validate()`), `needs_reference` (a frozen copy of the model as it
                     started, which the step's state holds), `training_batch` and
                     `training_batch_spec` (the batch a step takes, made from the data's:
                     the data's own by default)
  a train step       `normalizer` (what one batch's loss sum is divided by: its tokens, its
                     pairs), `loss` (one micro-batch's loss / the normalizer, and its metric
                     sums, which micro-batches add up), `train_metrics` (the logged metrics
                     from the summed sums)
  evaluation         `scores` (whether it scores an eval set's rows), `eval_sums` and
                     `eval_metrics` (a pass's sums and the metrics they give),
                     `eval_columns`, `eval_summary`, `final_summary` (how the results read)
  memory             `step_bytes` (what a train step holds beside the policy's forward pass)
  the report         `plots` (the metrics of its rows worth a plot)

The defaults describe an objective that reads documents, needs no reference and takes the
data's batch as it is; a new objective is one module with its class, and a job points at it:
`train.objective = fdl.Config(MyObjective, ...)`.

`Forward` is the model as one step applies it (the parameters trained, a LoRA base, the
frozen reference, dropout's key), so an objective computes logits without knowing which of
those the job has. `token_losses` is the per-token cross-entropy every objective over token
log-probabilities starts from.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.errors import config_error
from lingvo_lite.models.expert_balance import LOADS

Batch = dict[str, jax.Array]

# The kinds of rows a data source holds: documents (token streams, `data/source.py`), or
# preference pairs packed whole (`data/preference_data.py`'s `document_pairs`).
DOCUMENTS, PAIRS = "documents", "preference pairs"


def rows_of(source: Any) -> str:
  """The kind of rows `source` holds: PAIRS for a source of preference pairs, else DOCUMENTS."""
  return PAIRS if getattr(source, "document_pairs", False) else DOCUMENTS


@dataclasses.dataclass(frozen=True)
class Forward:
  """The model as one step applies it.

  Attributes:
    model: The model (a LoRA job's: with adapters, models/lora.py).
    frozen: The parameters the step reads and never changes: a LoRA job's base, or the frozen
      reference of an objective that needs one; None for neither.
    adapters: Whether the trained parameters are LoRA adapters over `frozen`.
    rng: The key of the adapters' dropout (training only), or None.
    loads: Where a train step collects the experts' loads of each forward pass (the
      statistic `expert_balance.LOADS`, for `after_step`), or None: the loads are dropped.
      Objectives never see them.
  """

  model: nn.Module
  frozen: Any = None
  adapters: bool = False
  rng: jax.Array | None = None
  loads: list[Any] | None = dataclasses.field(default=None, compare=False)

  def outputs(self, params: Any, batch: Batch, multi_token: bool = False
              ) -> tuple[Any, jax.Array, dict[str, Any]]:
    """The model's `logits_and_losses` on `batch` (its logits, auxiliary objective and
    statistics: models/family.py) with the trained `params`; `multi_token`: the logits
    with the multi-token modules' (models/multi_token.py)."""
    base, lora = (self.frozen, params) if self.adapters else (params, None)
    logits, auxiliary, statistics = self.model.logits_and_losses(
        base, batch["inputs"], batch.get("segment_ids"), batch.get("positions"), adapters=lora,
        rngs=None if self.rng is None else {"dropout": self.rng}, multi_token=multi_token)
    return logits, auxiliary, self._set_aside_loads(statistics)

  def _set_aside_loads(self, statistics: dict[str, Any]) -> dict[str, Any]:
    """`statistics` without the loads (a tree, not a metric), kept in `loads` if asked."""
    if LOADS not in statistics:
      return statistics
    statistics = dict(statistics)
    loads = statistics.pop(LOADS)
    if self.loads is not None:
      self.loads.append(loads)
    return statistics

  def logits(self, params: Any, batch: Batch) -> jax.Array:
    """The model's logits on `batch` with the trained `params`."""
    return self.outputs(params, batch)[0]

  def reference_logits(self, batch: Batch) -> jax.Array:
    """The reference's logits: the model applied to the frozen parameters alone (a LoRA model
    without its adapters is its base), with no gradient."""
    frozen = jax.lax.stop_gradient(self.frozen)
    return self.model.apply({"params": frozen}, batch["inputs"], batch.get("segment_ids"),
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


@dataclasses.dataclass(frozen=True)
class Plotted:
  """A metric an objective logs that the run report plots (where a job has such rows).

  Attributes:
    key: The row key (in metrics.jsonl and eval_<set>.jsonl).
    title: The plot's title.
    ylabel: The y axis's label.
    train: Drawn from the train rows.
    evals: Drawn from the eval sets' rows.
  """

  key: str
  title: str
  ylabel: str
  train: bool = True
  evals: bool = True


class Objective:
  """Base class of training objectives: subclasses are frozen dataclasses (their settings)
  that override what differs from these defaults (see the module docstring)."""

  # The kind of rows it reads (DOCUMENTS or PAIRS): of the train data, and of the eval sets it
  # scores.
  rows: ClassVar[str] = DOCUMENTS
  # Whether its evaluation takes each token's loss, for the score metrics of a task's
  # documents (evaluation runs them on a pass over a whole split).
  scores_documents: ClassVar[bool] = False
  # Whether its eval metrics take the UTF-8 bytes of the text the weighted tokens stand for
  # (of sources that know them: `token_bytes`).
  measures_bytes: ClassVar[bool] = False
  # Its eval metrics a results table shows, as (key, heading), besides `tokens` and `seconds`.
  eval_columns: ClassVar[tuple[tuple[str, str], ...]] = (("loss", "loss"),)
  # Its metrics the run report plots where a job has rows of them.
  plots: ClassVar[tuple[Plotted, ...]] = ()
  # How `train.objective` named it when it was a name ('lm', 'dpo'), for config files written
  # then (config/former_objectives.py); None for an objective that came after.
  former_name: ClassVar[str | None] = None
  # What `check` tells a user whose train data holds other rows.
  data_fix: ClassVar[str] = "give train_data of such rows, or another train.objective"

  def __repr__(self) -> str:  # A dataclass subclass writes its fields.
    return f"{type(self).__name__}()"

  @property
  def needs_reference(self) -> bool:
    """Whether a step reads a frozen reference: the model as it started (a LoRA job's base
    with its adapters off, else a frozen copy of the starting parameters)."""
    return False

  def check(self, path: str, train_data: Any) -> None:
    """Raises UsageError (one line, naming `path`: `train.objective`) where this objective
    cannot train on `train_data`: it is a class that computes no loss (this base), or the
    train data does not hold the rows it reads."""
    missing = [name for name in ("loss", "train_metrics", "eval_sums", "eval_metrics")
               if getattr(type(self), name) is getattr(Objective, name)]
    if missing:
      raise config_error(path, self, f"{type(self).__name__} does not define "
                         f"{', '.join(missing)}", "give an objective of training/objectives/ "
                         "(LanguageModelling, Dpo) or a subclass of Objective that defines them")
    held = rows_of(train_data)
    if held == self.rows:
      return
    task = getattr(getattr(train_data, "task", None), "name", None)
    raise config_error(path, self, f"reads {self.rows}, but train_data (a "
                       f"{type(train_data).__name__}" + (f" of {task}" if task else "")
                       + f") holds {held}", self.data_fix)

  def check_model(self, path: str, model: Any) -> None:
    """Raises UsageError (one line naming `path`) where `model` lacks what this objective
    trains (multi-token modules); by default every model serves."""
    del path, model

  def scores(self, source: Any) -> bool:
    """Whether this objective scores eval set `source` (it reads such rows)."""
    return rows_of(source) == self.rows

  # ---------------------------------------------------------------------------- a train step

  def training_batch(self, batch: Mapping[str, Any], state: Any, steps: Any
                     ) -> Mapping[str, Any]:
    """The rows a train step takes (this process's, host arrays), made from the data's
    `batch` before step `state.step`: `state` is the train state, `steps` the job's jitted
    steps (on_mesh/jitted.py: its model, mesh and shardings), for an objective whose rows come
    from the policy itself (rollouts scored before the loss). By default the data's batch."""
    del state, steps
    return batch

  def training_batch_spec(self, data_spec: Mapping[str, tuple[tuple[int, ...], str]]
                          ) -> Mapping[str, tuple[tuple[int, ...], str]]:
    """The global batch `training_batch` makes, as {key: (shape, dtype)}, from the train
    data's `batch_spec()`: what a train step is compiled for."""
    return data_spec

  def normalizer(self, batch: Batch) -> jax.Array:
    """What the summed loss of the whole `batch` is divided by (at least 1): by default its
    weighted tokens."""
    return jnp.maximum(jnp.sum(batch["weights"]), 1.0)

  def loss(self, forward: Forward, params: Any, batch: Batch, normalizer: jax.Array | float,
           z_loss: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(one micro-batch's loss sum / `normalizer`, its metric sums), differentiable in
    `params`. `z_loss`: train.z_loss, the weight of log(Z)^2 per weighted token for an
    objective that adds it. Dividing inside, by the whole batch's constant, gives gradients
    already normalized, and micro-batches that add up to the one-big-batch update."""
    raise NotImplementedError

  def train_metrics(self, sums: dict[str, jax.Array], normalizer: jax.Array, batch: Batch
                    ) -> dict[str, jax.Array]:
    """The metrics a train step logs (`loss` among them) from the sums of `loss` over the
    whole `batch`."""
    raise NotImplementedError

  # ---------------------------------------------------------------------------- evaluation

  def eval_sums(self, forward: Forward, params: Any, batch: Batch, per_token: bool = False
                ) -> dict[str, jax.Array]:
    """The sums over one eval batch that `eval_metrics` divides once the pass is done; with
    `per_token` (`scores_documents`), also each token's weighted loss [B, T] (`token_nats`)."""
    raise NotImplementedError

  def eval_metrics(self, totals: Mapping[str, float], text_bytes: float | None
                   ) -> dict[str, float]:
    """A pass's metrics (`tokens` among them) from its summed `eval_sums`; `text_bytes`: the
    bytes of text its weighted tokens stand for, where measured (`measures_bytes`)."""
    raise NotImplementedError

  def eval_summary(self, metrics: Mapping[str, float]) -> str:
    """A set's metrics in one line."""
    return f"loss {metrics['loss']:.4f}"

  def final_summary(self, metrics: Mapping[str, float]) -> str:
    """A set's metrics on the line a finished run ends with (`final eval loss: ...`)."""
    return self.eval_summary(metrics)

  # ---------------------------------------------------------------------------- memory

  def step_bytes(self, logits_bytes: int) -> int:
    """Bytes a train step holds per device beside the policy's forward pass, given the bytes
    of one pass's float32 logits (memory_fit.py's lower bound): by default none."""
    del logits_bytes
    return 0
