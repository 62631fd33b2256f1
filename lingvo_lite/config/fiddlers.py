"""Generic fiddlers: named config mutations any experiment accepts from `--fiddler=NAME`.

A fiddler is a function `(cfg: fdl.Config[Setup]) -> None`. The executor looks a name up
on the experiment class first, then in the experiment's module, then here.
"""

from __future__ import annotations

import inspect

import fiddle as fdl

from lingvo_lite.data.synthetic import SyntheticData


def _accepts(buildable: fdl.Buildable, name: str) -> bool:
  return name in inspect.signature(fdl.get_callable(buildable)).parameters


def _set_if_accepted(buildable: fdl.Buildable | None, **values) -> None:
  if buildable is None:
    return
  for name, value in values.items():
    if _accepts(buildable, name):
      setattr(buildable, name, value)


def _eval_configs(cfg: fdl.Config) -> dict[str | None, fdl.Buildable]:
  """The eval sets' configs by name (None for a single source), for fiddlers that change them
  all whether eval_data is one source or a mapping of them."""
  if isinstance(cfg.eval_data, dict):
    return dict(cfg.eval_data)
  return {} if cfg.eval_data is None else {None: cfg.eval_data}


def _replace_eval_config(cfg: fdl.Config, name: str | None, new: fdl.Buildable) -> None:
  if name is None:
    cfg.eval_data = new
  else:
    cfg.eval_data = {**cfg.eval_data, name: new}


def tiny(cfg: fdl.Config) -> None:
  """Shrinks any experiment to run in seconds on one CPU: 2 layers, width 64, 10 steps.

  The model shrinks as its family says (`LanguageModel.tiny`: the field changes it returns
  are set here, so models need no Fiddle); the loop and the data shrink alike for all.
  """
  model = cfg.model
  cfg.train.steps = 10
  cfg.train.log_every_steps = 5
  if isinstance(getattr(cfg, "decode", None), fdl.Config):
    # Room for a prompt in the tiny context (the model's max_length, at least 64), and a
    # cache of the whole tiny context (an experiment's own cache length is its model's).
    cfg.decode.max_new_tokens = 32
    cfg.decode.cache_length = None
  cfg.train.eval_every_steps = 0
  cfg.train.grad_accum_steps = 1
  cfg.checkpoint.every_steps = 10
  sequence_length = min(cfg.train_data.sequence_length, 64)
  family = fdl.get_callable(model)
  changes = family.tiny(fdl.ordered_arguments(model, include_defaults=True), sequence_length)
  for name, value in changes.items():
    setattr(model, name, value)
  eval_configs = list(_eval_configs(cfg).values())
  for data in [cfg.train_data, *eval_configs]:
    data.sequence_length = sequence_length
    data.global_batch_size = 4
    _set_if_accepted(data, per_device_batch_size=None)
    _set_if_accepted(data, max_examples=256)
  for data in eval_configs:
    data.num_batches = 2


def synthetic_data(cfg: fdl.Config) -> None:
  """Replaces the train and eval data with synthetic tokens of the same shapes."""
  def synthetic(data: fdl.Buildable, seed: int) -> fdl.Config:
    return fdl.Config(
        SyntheticData, vocab_size=cfg.model.vocab_size, sequence_length=data.sequence_length,
        global_batch_size=data.global_batch_size,
        per_device_batch_size=getattr(data, "per_device_batch_size", None), seed=seed,
        # A synthetic stream has no end: a whole-split eval set gets 10 batches.
        num_batches=getattr(data, "num_batches", None) or (None if seed == 0 else 10))

  cfg.train_data = synthetic(cfg.train_data, 0)
  for seed, (name, data) in enumerate(_eval_configs(cfg).items(), start=1):
    _replace_eval_config(cfg, name, synthetic(data, seed))


def no_eval(cfg: fdl.Config) -> None:
  """Drops the eval data: training runs no evaluation."""
  cfg.eval_data = None


def lora(cfg: fdl.Config) -> None:
  """Trains LoRA adapters (train.lora, models/lora.py: rank 8, alpha 16, every attention
  projection and MLP matrix) over the frozen model; set their fields after it, e.g.
  `--fiddler=lora --fdl.train.lora.rank=16`."""
  from lingvo_lite.models.lora import LoraSettings  # pylint: disable=g-import-not-at-top
  if not isinstance(cfg.train.lora, fdl.Config):
    cfg.train.lora = fdl.Config(LoraSettings)


def qlora(cfg: fdl.Config) -> None:
  """`lora` over a base held as int8 weights (model.quantization="int8_weights": QLoRA on the
  project's own int8 weights, models/quantization.py)."""
  lora(cfg)
  cfg.model.quantization = "int8_weights"


def dpo(cfg: fdl.Config) -> None:
  """Trains with DPO on the train data's preference pairs (train.objective: training/
  objectives/dpo.py: beta 0.1, against the model as it started); set its fields after it,
  e.g. `--fiddler=dpo --fdl.train.objective.beta=0.2`."""
  from lingvo_lite.training.objectives.dpo import Dpo  # pylint: disable=g-import-not-at-top
  objective = cfg.train.objective
  if not (isinstance(objective, fdl.Config) and fdl.get_callable(objective) is Dpo):
    cfg.train.objective = fdl.Config(Dpo)


def multi_token_prediction(cfg: fdl.Config) -> None:
  """Trains with DeepSeek-V3's multi-token prediction beside the next-token loss
  (train.objective: training/objectives/multi_token.py, weight 0.3) on the model's
  multi-token modules (one where a model of such a family has none: model.multi_token_layers);
  set its weight after it, e.g. `--fiddler=multi_token_prediction
  --fdl.train.objective.weight=0.1`."""
  # pylint: disable-next=g-import-not-at-top
  from lingvo_lite.training.objectives.multi_token import MultiTokenPrediction
  objective = cfg.train.objective
  if not (isinstance(objective, fdl.Config)
          and fdl.get_callable(objective) is MultiTokenPrediction):
    cfg.train.objective = fdl.Config(MultiTokenPrediction)
  # A family without the field is refused by the objective's check, in one line.
  if hasattr(fdl.get_callable(cfg.model), "multi_token_layers") and not getattr(
      cfg.model, "multi_token_layers", 0):
    cfg.model.multi_token_layers = 1
