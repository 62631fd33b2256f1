"""Experiments and the root object they configure.

An experiment is a short class whose `config()` classmethod returns `fdl.Config[Setup]`.
`Setup` is the built result: model, optimizer, data, partitioner and loop settings, each a
plain object. `Setup.validate()` checks what no single constructor can (fields that must
agree with each other), before any device time is spent.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Annotated, Any, Mapping

import fiddle as fdl

from lingvo_lite import fields, target as targets
from lingvo_lite.checkpoints.manager import CheckpointSettings
from lingvo_lite.data.source import DataSource, check_ready, vocabulary_fingerprint
from lingvo_lite.decode.settings import DecodeSettings
from lingvo_lite.errors import config_error, shown
from lingvo_lite.fields import NonNegativeFloat, PositiveFloat, PositiveInt, Range
from lingvo_lite.models import lora as lora_lib
from lingvo_lite.models.family import ArrayShape, LanguageModel
from lingvo_lite.models.lora import LoraSettings
from lingvo_lite.models.pipeline import PipelineSettings, check as check_pipeline
from lingvo_lite.training import objectives
from lingvo_lite.training.objectives.lm import LanguageModelling
from lingvo_lite.training.objectives.objective import Objective, rows_of
from lingvo_lite.training.optimizers import AdamW
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.runtime.watchdog import WatchdogSettings
from lingvo_lite.weights.formats import WeightSource


@dataclasses.dataclass(frozen=True)
class TrainLoop:
  """How long to train, and what to do along the way.

  Attributes:
    steps: Optimizer steps in the whole run (a resumed run continues up to this count).
    seed: Root seed of parameter initialization (data sources have their own seeds).
    log_every_steps: Steps between metric logs.
    eval_every_steps: Steps between evaluations; 0 evaluates only at the end.
    grad_accum_steps: Micro-batches per step (each global_batch / k rows).
    pipeline_microbatches: With a pipeline (partitioner.ici_stage x dcn_stage > 1), the
      microbatches each (accumulation) batch streams through the stages
      (models/pipeline.py); it divides each data-parallel replica's rows. More shrink the
      bubble, (stages - 1) / (microbatches x repeats + stages - 1) of the loop.
    pipeline_repeats: The layer blocks each stage holds: 1 is GPipe, more the circular
      schedule (stage s holds blocks s, s + stages, ...; needs microbatches >= stages).
    z_loss: Weight of the auxiliary loss z_loss * log(Z)^2 per weighted token (GPT-J used
      1e-4), for an objective that adds it (the next-token loss; DPO's has no such term).
    profile_start_step: First step of a profiler trace window; -1 disables tracing.
    profile_steps: Steps in the trace window (written under JOB/summaries/train/, where
      TensorBoard's Profile tab finds it).
    log_grad_norm: Compute and log the global gradient norm (one more pass over the
      gradients each step).
    peak_tflops_per_device: Peak for the MFU figure; None looks the device up in a
      datasheet table, or on a CPU measures the best float32 2048^3 matmul.
    init_from: A weight source whose parameters a job without a checkpoint of its own starts
      from, with a fresh optimizer (the source of any format of weights/formats.py: another
      job's step, a Hugging Face folder, a GGUF file, slim weights); None initializes from
      `seed`. With `lora`, the frozen base (a `peft:` source also gives the adapters' start).
    lora: LoRA adapters (models/lora.py: rank, alpha, dropout, which weight matrices): only
      they are trained, over the frozen base model, and only they are checkpointed; None
      trains every parameter. With `model.quantization="int8_weights"`, the base is held in
      int8 (QLoRA).
    objective: What a step minimizes, a part (training/objectives/): the next-token loss on
      the weighted tokens (`LanguageModelling`, the default), or DPO's on the train data's
      preference pairs against a frozen reference (`fdl.Config(Dpo, beta=0.1)`, or
      `--fiddler=dpo`: training/objectives/dpo.py), or any `Objective` subclass.
  """

  steps: PositiveInt = 1000
  seed: int = 0
  log_every_steps: PositiveInt = 10
  eval_every_steps: Annotated[int, Range(0, note="0 evaluates only at the end")] = 0
  grad_accum_steps: PositiveInt = 1
  pipeline_microbatches: PositiveInt = 1
  pipeline_repeats: PositiveInt = 1
  z_loss: NonNegativeFloat = 0.0
  profile_start_step: Annotated[int, Range(-1, note="-1 disables tracing")] = -1
  profile_steps: PositiveInt = 3
  log_grad_norm: bool = True
  peak_tflops_per_device: PositiveFloat | None = None
  init_from: WeightSource | None = None
  lora: LoraSettings | None = None
  objective: Objective = LanguageModelling()

  @property
  def has_frozen(self) -> bool:
    """Whether a train step reads frozen parameters (a LoRA base, an objective's reference)."""
    return self.lora is not None or self.objective.needs_reference


# The name a single eval source (not a mapping) is reported under.
DEFAULT_EVAL_SET = "validation"
# A set's name names its files (`eval_<name>.jsonl`), well inside a file name's 255 bytes.
_EVAL_SET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything a program needs, built from an experiment's config.

  Attributes:
    eval_data: The eval sets: a mapping name -> source (`{"validation": ..., "held_out":
      ...}`), or one source, named "validation"; None evaluates nothing. A set's fields are
      reached by name on the command line: `--fdl.eval_data.held_out.num_batches=8`.
  """

  model: LanguageModel
  optimizer: AdamW
  train_data: DataSource
  eval_data: DataSource | Mapping[str, DataSource] | None
  partitioner: Partitioner = Partitioner()
  train: TrainLoop = TrainLoop()
  checkpoint: CheckpointSettings = CheckpointSettings()
  decode: DecodeSettings = DecodeSettings()
  watchdog: WatchdogSettings = WatchdogSettings()

  def validate(self, target: targets.Target | None = None) -> None:
    """Raises UsageError naming the field, the value and the fix for the first problem.

    First every field of every part against its annotation and the constraints declared
    with it (`lingvo_lite.fields`), then the model (its family's `validate`: its size and
    what its fields must agree on), then what no single part shows: parts that must agree
    with each other, and the partitioning (from shapes only).

    Args:
      target: The devices the setup is for; None takes the active one (this host's, or the
        compile program's topology).
    """
    target = target or targets.current()
    fields.check_part("", self)
    model = self.model
    model.validate(target, "model")
    validate_optimizer = getattr(self.optimizer, "validate", None)
    if validate_optimizer is not None:  # A user's own optimizer part may have no checks.
      validate_optimizer(target, "optimizer")
    _check_post_training(self)
    self.decode.validate(model.max_length)
    _check_eval_set_names(self.eval_data)
    for name, data in self.data_sources():
      if data.global_batch_size % self.train.grad_accum_steps and name == "train_data":
        raise config_error("train.grad_accum_steps", self.train.grad_accum_steps,
                           f"does not divide train_data.global_batch_size="
                           f"{data.global_batch_size}")
      model.check_sequence_length(f"{name}.sequence_length", data.sequence_length)
      _check_vocabulary(name, data, model)
      if name != "train_data" and not data.num_batches and not callable(
          getattr(data, "examples_per_pass", None)):
        raise config_error(f"{name}.num_batches", data.num_batches,
                           f"a {type(data).__name__} has no end to evaluate up to",
                           "give the number of batches of one eval pass")
    _check_partitioning(self, target)

  @property
  def eval_sets(self) -> dict[str, DataSource]:
    """The eval sets by name, in the config's order (a single source is "validation")."""
    if self.eval_data is None:
      return {}
    if isinstance(self.eval_data, Mapping):
      return dict(self.eval_data)
    return {DEFAULT_EVAL_SET: self.eval_data}

  def eval_set_path(self, name: str) -> str:
    """The config path of eval set `name`, as `--fdl.` reaches it."""
    return f"eval_data.{name}" if isinstance(self.eval_data, Mapping) else "eval_data"

  def data_sources(self, train: bool = True) -> list[tuple[str, DataSource]]:
    """(config path, source) of the train data (unless `train=False`) and every eval set."""
    sources = [("train_data", self.train_data)] if train else []
    return sources + [(self.eval_set_path(name), data) for name, data in self.eval_sets.items()]

  def check_data(self, train: bool = True) -> None:
    """Reads what each data source must read to know it is usable (the train data's only
    with `train`), and checks that every eval set has the train data's vocabulary.

    Not part of `validate()`: materializing a corpus takes seconds that `--mode=print` need
    not spend. A program calls it after `validate()` and before it writes into the job dir
    or allocates, so that a source that turns out empty (a seqio split with no example of
    the sequence length, a folder with no file of that split) is a one-line error then, not
    a failure of the prefetch thread mid-run.

    Raises:
      UsageError: naming the field, e.g. `train_data.sequence_length=4096: ...`.
    """
    # The vocabularies first: comparing them reads no data, and refuses before a store of the
    # wrong tokens is built.
    trained_on = vocabulary_fingerprint(self.train_data)
    for name, data in self.data_sources(train=False):
      fingerprint = vocabulary_fingerprint(data)
      if trained_on is not None and fingerprint is not None and fingerprint != trained_on:
        raise config_error(f"{name}.task", getattr(getattr(data, "task", None), "name", data),
                           f"tokenizes with another vocabulary ({fingerprint}) than the "
                           f"model's train data ({trained_on})",
                           "give the eval set the train data's vocabulary")
    for name, data in self.data_sources(train):
      check_ready(name, data)


def _check_post_training(setup: Setup) -> None:
  """LoRA's targets, and the objective's rows: what `train.lora` and `train.objective` need."""
  lora_lib.refuse_direct_setting(setup.model)
  train = setup.train
  if train.lora is not None:
    adapted = setup.model.with_adapters(train.lora)
    del adapted  # A family without adapters refuses above, naming train.lora.
    lora_lib.check_targets(train.lora, setup.model, setup.train_data.sequence_length)
  train.objective.check("train.objective", setup.train_data)
  train.objective.check_model("train.objective", setup.model)
  train.objective.check_setup("train.objective", setup)
  for name, data in setup.data_sources(train=False):
    # Refused now, not when the first evaluation comes (GRPO's prompt records are sampled,
    # not scored).
    if not objectives.scorer(train.objective, data).scores(data):
      raise config_error(name, type(data).__name__, f"holds {rows_of(data)}, which no "
                         "objective scores", "give eval sets of documents or preference "
                         "pairs, or none")


def _check_eval_set_names(eval_data: Any) -> None:
  if not isinstance(eval_data, Mapping):
    return
  if not eval_data:
    raise config_error("eval_data", {}, "names no eval set", "give sets, or None for none")
  for name in eval_data:
    if not isinstance(name, str) or not _EVAL_SET_NAME.fullmatch(name):
      raise config_error("eval_data", list(eval_data), f"the set name {shown(name)} is not "
                         "a Python identifier of at most 100 characters (it names files and "
                         "--fdl. paths)", "use letters, digits and underscores, e.g. 'held_out'")


def _check_vocabulary(name: str, data: DataSource, model: LanguageModel) -> None:
  """The model's vocabulary covers the data's token ids (when the source knows them)."""
  vocab = getattr(data, "vocab_size", None)
  if vocab is None or vocab <= model.vocab_size:
    return
  if dataclasses.is_dataclass(data) and "vocab_size" in {
      f.name for f in dataclasses.fields(data)}:
    raise config_error(f"{name}.vocab_size", vocab,
                       f"exceeds model.vocab_size={model.vocab_size}")
  # The source's vocabulary comes with its data (a seqio Task's): the model must follow.
  raise config_error("model.vocab_size", model.vocab_size,
                     f"is smaller than the {vocab} tokens of {name}'s vocabulary",
                     f"use at least {vocab}")


def _check_partitioning(setup: Setup, target: targets.Target) -> None:
  """Mesh vs devices, rules, sharded dimensions and batch divisibility, from shapes only."""
  partitioner = setup.partitioner
  partitioner.check_slices(target.num_slices, target.name, target.platform)
  axis_sizes = partitioner.mesh_axis_sizes(target.num_devices)
  model = setup.model
  parameters = model.parameter_shapes()
  used = {"batch", "length"} | {name for p in parameters for name in p.axes if name}
  axis_fields = model.logical_axes()
  partitioner.check_rules(used, model_axes=axis_fields)
  data_parallel = partitioner.data_parallel_size(axis_sizes)
  _check_pipeline(setup, target, data_parallel)
  for parameter in parameters:
    _check_distinct_mesh_axes(partitioner, parameter)
    for size, name, mesh_axes in zip(parameter.shape, parameter.axes,
                                     partitioner.mesh_axes_of(parameter.axes)):
      ways = math.prod(axis_sizes[axis] for axis in mesh_axes)
      if size % ways:
        field = f"model.{axis_fields[name]}" if name in axis_fields else "model"
        raise config_error(
            field, size, f"the {name!r} dimension of parameter {parameter.path} is not "
            f"divisible by mesh axes {' x '.join(mesh_axes)} = {ways}",
            "change the size or the partitioner's axis sizes or rules")
  batch_axes = " x ".join(partitioner.mesh_axes_of(("batch",))[0]) or "none"
  for name, data in setup.data_sources():
    rows = data.global_batch_size // (setup.train.grad_accum_steps if name == "train_data" else 1)
    if rows % data_parallel or data.global_batch_size % target.num_processes:
      raise config_error(
          f"{name}.global_batch_size", data.global_batch_size,
          f"{'each micro-batch ' if rows != data.global_batch_size else ''}must split "
          f"evenly over the data-parallel size {data_parallel} (mesh axes {batch_axes}) and "
          f"{target.num_processes} processes",
          f"use a multiple of {math.lcm(data_parallel, target.num_processes)}")


def _check_pipeline(setup: Setup, target: targets.Target, data_parallel: int) -> None:
  """A pipeline's stages against the layers and its microbatches against the batch (before
  the parameters' divisibility, whose message would not name the pipeline's fields)."""
  if setup.partitioner.mesh_axis_sizes(target.num_devices)["stage"] > 1 and (
      not setup.partitioner.pipelines()):
    raise config_error("partitioner.rules", dict(setup.partitioner.rules).get("layers"),
                       "a stage axis (partitioner.ici_stage x dcn_stage > 1) needs the "
                       "'layers' axis split over it", "map ('layers', 'stage')")
  pipeline = pipeline_settings(setup, target.num_devices)
  if pipeline is None:
    return
  model = setup.model
  if not hasattr(model, "with_pipeline"):
    raise config_error("partitioner.ici_stage", pipeline.stages,
                       f"{type(model).__name__} has no scanned layer stack to pipeline",
                       "leave ici_stage and dcn_stage 1")
  rows, left = divmod(setup.train_data.global_batch_size,
                      setup.train.grad_accum_steps * data_parallel)
  # A batch the data axes do not divide is refused below, naming the batch size.
  check_pipeline(pipeline, model.scan_layers, model.num_layers, model.variant_period(),
                 None if left else rows, model.scan_prefix())
  for name, data in setup.data_sources(train=False):  # Evaluated in training, pipelined.
    rows, left = divmod(data.global_batch_size, data_parallel)
    if not left and rows % pipeline.microbatches:
      raise config_error(f"{name}.global_batch_size", data.global_batch_size,
                         f"its {rows} rows per data-parallel replica do not split into "
                         f"train.pipeline_microbatches={pipeline.microbatches}",
                         f"use a multiple of {data_parallel * pipeline.microbatches}")


def pipeline_settings(setup: Setup, num_devices: int) -> PipelineSettings | None:
  """The pipeline a train step of `setup` runs on `num_devices` (models/pipeline.py): the
  `stage` mesh axis's size with `train.pipeline_*`; None for one stage (the microbatch and
  repeat settings then do nothing, so a pipelined job resumes on one stage as it is)."""
  stages = setup.partitioner.mesh_axis_sizes(num_devices)["stage"]
  if stages == 1 or not setup.partitioner.pipelines():
    return None
  return PipelineSettings(stages, setup.train.pipeline_microbatches,
                          setup.train.pipeline_repeats)


def _check_distinct_mesh_axes(partitioner: Partitioner, parameter: ArrayShape) -> None:
  """No two dimensions of a parameter are mapped to one mesh axis.

  A mesh axis splits at most one dimension of an array; where the rules ask for more, Flax
  silently leaves the later dimension unsplit (or JAX refuses the sharding mid-run), so the
  parameter would not be sharded as configured. A logical axis with a second rule (a
  fallback Flax tries in order) is what the user asked for, and is let through.
  """
  shared = partitioner.shared_mesh_axis(parameter.axes)
  if shared is not None:
    first, name, axis = shared
    raise config_error(
        "partitioner.rules", f"{first} -> {axis}, {name} -> {axis}",
        f"parameter {parameter.path} has dimensions {first!r} and {name!r}, and one mesh "
        "axis can split only one dimension of an array",
        f"map {name!r} or {first!r} to another mesh axis or to None")


def setup_config(**parts: Any) -> fdl.Config[Setup]:
  """`fdl.Config(Setup, **parts)` with every part the caller leaves out as a default Config.

  Defaults must be Configs, not instances, so `--fdl.partitioner.ici_fsdp=2` and fiddlers
  can change a field of a part the experiment did not mention.
  """
  parts.setdefault("eval_data", None)
  return with_default_parts(fdl.Config(Setup, **parts))


def is_setup_class(fn: Any) -> bool:
  """Whether a config of `fn` builds a Setup: `Setup` itself, or a subclass of it (a user's
  own Setup with more fields, or other defaults, is a legitimate extension: every program
  reads only the fields `Setup` declares)."""
  return isinstance(fn, type) and issubclass(fn, Setup)


def with_default_parts(cfg: Any) -> Any:
  """A Setup config with each default part it does not set made a default Config (in place):
  a config written before the part existed (an older job's config.json) or built with
  `fdl.Config(Setup, ...)` directly still takes `--fdl.decode.slots=4`. A part is a field
  whose default is a dataclass instance (`train: TrainLoop = TrainLoop()`); a Setup subclass's
  own defaults and parts count too. Other configs pass."""
  if isinstance(cfg, fdl.Config) and is_setup_class(fdl.get_callable(cfg)):
    for field in dataclasses.fields(fdl.get_callable(cfg)):
      if field.name not in cfg.__arguments__ and dataclasses.is_dataclass(field.default):
        setattr(cfg, field.name, _config_of(field.default))
  return cfg


def _config_of(part: Any) -> fdl.Config:
  """The Config that builds `part`, a dataclass instance: its class, with the fields where
  `part` differs from the class's own defaults (`TrainLoop()` -> `fdl.Config(TrainLoop)`)."""
  cls = type(part)
  try:
    reference = cls()
  except TypeError:  # A field without a default: every field is set.
    reference = None
  changed = {field.name: getattr(part, field.name) for field in dataclasses.fields(part)
             if field.init and (reference is None
                                or getattr(part, field.name) != getattr(reference, field.name))}
  return fdl.Config(cls, **changed)


class Experiment:
  """Base class of experiments: subclasses override `config()` and register themselves.

  Fiddlers specific to an experiment may be defined as static methods taking the config.
  `config()` usually returns `setup_config(model=..., optimizer=..., train_data=..., ...)`.
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    raise NotImplementedError(f"{cls.__name__}.config() must return fdl.Config(Setup, ...)")
