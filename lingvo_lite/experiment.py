"""Experiments and the root object they configure.

An experiment is a short class whose `config()` classmethod returns `fdl.Config[Setup]`.
`Setup` is the built result: model, optimizer, data, partitioner and loop settings, each a
plain object. `Setup.validate()` checks what no single constructor can (fields that must
agree with each other), before any device time is spent.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, get_args

import fiddle as fdl
import flax.linen as nn
import jax

from lingvo_lite.checkpoints import CheckpointSettings
from lingvo_lite.data.source import DataSource
from lingvo_lite.errors import config_error
from lingvo_lite.models.transformer import TransformerLM
from lingvo_lite.optimizers import AdamW
from lingvo_lite.partitioning import Partitioner


@dataclasses.dataclass(frozen=True)
class TrainLoop:
  """How long to train, and what to do along the way.

  Attributes:
    steps: Optimizer steps in the whole run (a resumed run continues up to this count).
    seed: Root seed of parameter initialization (data sources have their own seeds).
    log_every_steps: Steps between metric logs.
    eval_every_steps: Steps between evaluations; 0 evaluates only at the end.
    grad_accum_steps: Micro-batches per step (each global_batch / k rows).
    z_loss: Weight of the auxiliary loss z_loss * log(Z)^2 (GPT-J used 1e-4).
    profile_start_step: First step of a profiler trace window; -1 disables tracing.
    profile_steps: Steps in the trace window (written to JOB/profile/).
    log_grad_norm: Compute and log the global gradient norm (one more pass over the
      gradients each step).
    peak_tflops_per_device: Peak for the MFU figure; None looks the device up in a
      datasheet table, or on a CPU measures the best float32 2048^3 matmul.
  """

  steps: int = 1000
  seed: int = 0
  log_every_steps: int = 10
  eval_every_steps: int = 0
  grad_accum_steps: int = 1
  z_loss: float = 0.0
  profile_start_step: int = -1
  profile_steps: int = 3
  log_grad_norm: bool = True
  peak_tflops_per_device: float | None = None


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything a program needs, built from an experiment's config."""

  model: TransformerLM
  optimizer: AdamW
  train_data: DataSource
  eval_data: DataSource | None
  partitioner: Partitioner = Partitioner()
  train: TrainLoop = TrainLoop()
  checkpoint: CheckpointSettings = CheckpointSettings()

  def validate(self) -> None:
    """Raises UsageError naming the field, the value and the fix for the first problem."""
    _check_literals(self)
    model = self.model
    _positive(self, ("model.vocab_size", "model.num_layers", "model.dim", "model.num_heads",
                     "train.steps", "train.log_every_steps", "train.grad_accum_steps",
                     "train_data.global_batch_size", "train_data.sequence_length",
                     "checkpoint.every_steps"))
    if model.head_dim is None and model.dim % model.num_heads:
      raise config_error("model.num_heads", model.num_heads,
                         f"does not divide model.dim={model.dim}",
                         "choose a divisor of dim or set model.head_dim")
    if model.num_heads % model.resolved_num_kv_heads:
      raise config_error("model.num_kv_heads", model.num_kv_heads,
                         f"does not divide model.num_heads={model.num_heads}",
                         "grouped-query attention needs num_heads % num_kv_heads == 0")
    if model.attention_implementation == "cudnn":
      _check_cudnn_attention(model)
    rotary_dim = model.resolved_rotary_dim
    if rotary_dim % 2 or rotary_dim > model.resolved_head_dim:
      raise config_error("model.rotary_dim", model.rotary_dim,
                         f"must be even and at most head_dim={model.resolved_head_dim}")
    for name in ("train_data", "eval_data"):
      data = getattr(self, name)
      if data is None:
        continue
      if data.global_batch_size % self.train.grad_accum_steps and name == "train_data":
        raise config_error("train.grad_accum_steps", self.train.grad_accum_steps,
                           f"does not divide train_data.global_batch_size="
                           f"{data.global_batch_size}")
      if model.position == "learned" and data.sequence_length > model.max_length:
        raise config_error(f"{name}.sequence_length", data.sequence_length,
                           f"exceeds model.max_length={model.max_length} of learned positions")
      vocab = getattr(data, "vocab_size", None)
      if vocab is not None and vocab > model.vocab_size:
        raise config_error(f"{name}.vocab_size", vocab,
                           f"exceeds model.vocab_size={model.vocab_size}")
    if self.eval_data is not None and not self.eval_data.num_batches:
      raise config_error("eval_data.num_batches", self.eval_data.num_batches,
                         "an eval set needs a positive number of batches per pass")
    _check_partitioning(self)
    if self.train.eval_every_steps < 0:
      raise config_error("train.eval_every_steps", self.train.eval_every_steps,
                         "must be >= 0 (0 evaluates only at the end)")


def _check_cudnn_attention(model: TransformerLM) -> None:
  """What jax.nn.dot_product_attention's cuDNN kernel accepts, checked before any device time."""
  problem = None
  device = jax.devices()[0]
  # Hopper (compute capability 9.0) and newer take heads up to 256 wide, older GPUs 128.
  capability = getattr(device, "compute_capability", "0")
  widest_head = 256 if float(capability) >= 9.0 else 128
  if jax.default_backend() != "gpu" or "NVIDIA" not in device.device_kind.upper():
    problem = f"needs an NVIDIA GPU (this device: {device.device_kind})"
  elif model.dtype not in ("bfloat16", "float16"):
    problem = f"needs model.dtype 'bfloat16' or 'float16' (got {model.dtype!r})"
  elif model.resolved_head_dim % 8 or model.resolved_head_dim > widest_head:
    problem = (f"needs a head_dim that is a multiple of 8 and at most {widest_head} on "
               f"{device.device_kind} (got {model.resolved_head_dim})")
  if problem:
    raise config_error("model.attention_implementation", "cudnn", problem,
                       "or use 'einsum' or 'xla'")


# The config field that sizes each logical axis, for messages about sharding.
_AXIS_FIELDS = {"embed": "model.dim", "mlp": "model.mlp_dim", "heads": "model.num_heads",
                "kv": "model.head_dim", "vocab": "model.vocab_size", "layers": "model.num_layers",
                "norm": "model.dim", "position": "model.max_length"}


def _check_partitioning(setup: Setup) -> None:
  """Mesh vs devices, rules, sharded dimensions and batch divisibility, from shapes only."""
  partitioner = setup.partitioner
  axis_sizes = partitioner.mesh_axis_sizes(jax.device_count())
  tokens = jax.ShapeDtypeStruct((1, setup.train_data.sequence_length), jax.numpy.int32)
  boxed = jax.eval_shape(setup.model.init, jax.random.key(0), tokens)["params"]
  specs = nn.get_partition_spec(boxed)
  paths_specs = jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(
      x, jax.sharding.PartitionSpec))[0]
  shapes = jax.tree.leaves(nn.meta.unbox(boxed))
  used = {"batch", "length"} | {name for _, spec in paths_specs for name in spec if name}
  partitioner.check_rules(used)
  for (path, spec), shape in zip(paths_specs, shapes):
    for size, name, mesh_axes in zip(shape.shape, spec, partitioner.mesh_axes_of(spec)):
      ways = math.prod(axis_sizes[axis] for axis in mesh_axes)
      if size % ways:
        field = _AXIS_FIELDS.get(name, "model")
        raise config_error(
            field, size, f"the {name!r} dimension of parameter "
            f"{jax.tree_util.keystr(path)} is not divisible by mesh axes "
            f"{' x '.join(mesh_axes)} = {ways}",
            "change the size or the partitioner's axis sizes or rules")
  data_parallel = partitioner.data_parallel_size(axis_sizes)
  batch_axes = " x ".join(partitioner.mesh_axes_of(("batch",))[0]) or "none"
  for name in ("train_data", "eval_data"):
    data = getattr(setup, name)
    if data is None:
      continue
    rows = data.global_batch_size // (setup.train.grad_accum_steps if name == "train_data" else 1)
    if rows % data_parallel or data.global_batch_size % jax.process_count():
      raise config_error(
          f"{name}.global_batch_size", data.global_batch_size,
          f"{'each micro-batch ' if rows != data.global_batch_size else ''}must split "
          f"evenly over the data-parallel size {data_parallel} (mesh axes {batch_axes}) and "
          f"{jax.process_count()} processes", f"use a multiple of {data_parallel}")


def _positive(setup: Setup, paths: tuple[str, ...]) -> None:
  for path in paths:
    value: Any = setup
    for part in path.split("."):
      value = getattr(value, part)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise config_error(path, value, "must be a positive integer")


def _check_literals(setup: Setup) -> None:
  """Every `Literal[...]`-typed field of a built part holds one of its choices."""
  for part_name in ("model", "optimizer", "partitioner", "train", "checkpoint"):
    part = getattr(setup, part_name)
    hints = typing.get_type_hints(type(part))
    for field in dataclasses.fields(part):
      hint = hints.get(field.name)
      if typing.get_origin(hint) is typing.Literal:
        value = getattr(part, field.name)
        if value not in get_args(hint):
          choices = ", ".join(repr(c) for c in get_args(hint))
          raise config_error(f"{part_name}.{field.name}", value, f"valid choices: {choices}")


def setup_config(**parts: Any) -> fdl.Config[Setup]:
  """`fdl.Config(Setup, **parts)` with every part the caller leaves out as a default Config.

  Defaults must be Configs, not instances, so `--fdl.partitioner.ici_fsdp=2` and fiddlers
  can change a field of a part the experiment did not mention.
  """
  defaults = {"partitioner": Partitioner, "train": TrainLoop, "checkpoint": CheckpointSettings}
  for name, part in defaults.items():
    parts.setdefault(name, fdl.Config(part))
  parts.setdefault("eval_data", None)
  return fdl.Config(Setup, **parts)


class Experiment:
  """Base class of experiments: subclasses override `config()` and register themselves.

  Fiddlers specific to an experiment may be defined as static methods taking the config.
  `config()` usually returns `setup_config(model=..., optimizer=..., train_data=..., ...)`.
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    raise NotImplementedError(f"{cls.__name__}.config() must return fdl.Config(Setup, ...)")
