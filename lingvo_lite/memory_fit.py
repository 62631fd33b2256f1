"""Whether a program's arrays fit this host's devices, judged from shapes before allocating.

A config can be valid and still far too large for the machine at hand: the float32 parameters,
gradients and Adam moments of a 6.7B-parameter model are 108 GB; the attention scores of one
30,000-token sequence are 3.6 GB per head. Allocating it anyway fails late, as an
out-of-memory abort in C++ (or, on a CPU host, by swapping the machine to a halt), after
compiling or after training. The train, eval and decode programs ask here first and refuse
with one line naming the sizes and the fixes.

The count is a lower bound, per device, at the program's largest step:
- training: each device's shard of the parameters, their gradients and the optimizer's
  moments (`model.parameter_shapes()`, split as the partitioner's rules split them; the moments
  in `optimizer.moment_dtype`, and none on the device where `optimizer.offload_state` keeps
  them in host memory between steps: the update brings them in array by array), plus the
  step's activations;
- an evaluation (the eval program's, or the one a training run does): the parameters (and,
  within training, the moments) plus the eval step's activations.
The activations counted are the int32/float32 batch, the float32 logits of the rows one step
computes (a micro-batch in training), and, where the model's attention kernel holds them (its
row says: models/attention_kernels; the written-out einsum does), one layer's float32 attention
scores (rows x heads x length x length for the transformer families: `attention_scores_shape`):
every layer materializes them, so at least one layer's worth is live. Other activations, which
remat policies trade, are not counted, nor are the scores of a fused kernel ("xla", "cudnn",
"splash"), which XLA or the kernel may never hold whole. The decode program's bound counts the
KV cache as the family sizes it (`cache_bytes`). A CPU's devices share the host's RAM, so their
needs add up; an accelerator is compared with its own memory (`memory_stats()["bytes_limit"]`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

import jax
import numpy as np

from lingvo_lite import target as targets
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup

_GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Need:
  """Bytes one device needs at the peak of a program, by what they hold.

  Attributes:
    parameters: The device's shard of the trained parameters (a LoRA job's adapters).
    gradients: Of the gradients (0 where the peak is an evaluation).
    moments: Of the optimizer's moments on the device (0 in the eval program, and where
      they are offloaded).
    batch: The batch's arrays and the float32 logits of the rows one step computes.
    attention: One layer's float32 attention scores for those rows.
    step: What the peak is: "training step" or "eval step".
    data: The config path of the data that step reads ("train_data" or "eval_data").
    frozen: Of the frozen parameters: a LoRA job's base (int8 for QLoRA), a full DPO job's
      reference copy; no gradients, no moments.
    host_moments: Of the optimizer's moments kept in host memory between steps
      (`optimizer.offload_state`): not in the device's `total`.
  """

  parameters: int
  gradients: int
  moments: int
  batch: int
  attention: int = 0
  step: str = "training step"
  data: str = "train_data"
  frozen: int = 0
  host_moments: int = 0

  @property
  def total(self) -> int:
    return self.state + self.batch + self.attention

  @property
  def state(self) -> int:
    return self.parameters + self.gradients + self.moments + self.frozen


def _ceil_div(a: int, b: int) -> int:
  return -(-a // b)


def _sharder(setup: Setup, num_devices: int) -> Callable[[tuple[int, ...], tuple], int]:
  """Elements of one device's shard of an array of `shape` with logical `axes`."""
  partitioner = setup.partitioner
  axis_sizes = partitioner.mesh_axis_sizes(num_devices)

  def shard(shape: tuple[int, ...], axes: tuple) -> int:
    ways = [math.prod(axis_sizes[a] for a in mesh_axes)
            for mesh_axes in partitioner.mesh_axes_of(axes)]
    return math.prod(_ceil_div(size, way) for size, way in zip(shape, ways))
  return shard


def _step_bytes(setup: Setup, batch_shape: tuple[int, int], rows: int, shard
                ) -> tuple[int, int]:
  """(batch and logits, attention scores) of one step computing `rows` rows of a batch of
  `batch_shape` (rows, length)."""
  length = batch_shape[1]
  # int32 inputs and targets and float32 weights of the whole batch, float32 logits of `rows`.
  batch = (12 * shard(batch_shape, ("batch", "length"))
           + 4 * shard((rows, length, setup.model.vocab_size), ("batch", "length", "vocab")))
  attention = 0
  if setup.model.holds_attention_scores:
    attention = 4 * shard(*setup.model.attention_scores_shape(rows, length))
  return batch, attention


def per_device_need(setup: Setup, num_devices: int) -> Need:
  """The training lower bound described above, for one of `num_devices` devices: the larger
  of a training step and the evaluations the run does."""
  shard = _sharder(setup, num_devices)
  parameters, frozen, moments = _trained_and_frozen_bytes(setup, shard)
  host_moments = 0
  if getattr(setup.optimizer, "offload_state", False):
    moments, host_moments = 0, moments
  train = setup.train_data
  # The rows a step trains on: the data's, or those the objective makes (GRPO's completions).
  spec = setup.train.objective.training_batch_spec(train).get("inputs")
  shape = tuple(spec[0]) if spec else (train.global_batch_size, train.sequence_length)
  rows = shape[0] // setup.train.grad_accum_steps
  batch, attention = _step_bytes(setup, shape, rows, shard)
  # What the objective holds beside the policy's pass (DPO: the reference's logits).
  batch += setup.train.objective.step_bytes(4 * shard(
      (rows, shape[1], setup.model.vocab_size), ("batch", "length", "vocab")))
  need = Need(parameters=parameters, gradients=parameters, moments=moments, batch=batch,
              attention=attention, frozen=frozen, host_moments=host_moments)
  for name, data in setup.data_sources(train=False):
    # The gradients are gone between steps, when the run evaluates; the state is not.
    batch, attention = _step_bytes(setup, (data.global_batch_size, data.sequence_length),
                                   data.global_batch_size, shard)
    evaluation = Need(parameters=parameters, gradients=0, moments=moments, batch=batch,
                      attention=attention, step="eval step", data=name, frozen=frozen,
                      host_moments=host_moments)
    need = max(need, evaluation, key=lambda n: n.total)
  return need


def eval_need(setup: Setup, num_devices: int) -> Need:
  """The eval program's lower bound: the parameters and the largest eval step's activations
  (one set is evaluated at a time)."""
  shard = _sharder(setup, num_devices)
  needs = []
  for name, data in setup.data_sources(train=False):
    batch, attention = _step_bytes(setup, (data.global_batch_size, data.sequence_length),
                                   data.global_batch_size, shard)
    needs.append(Need(parameters=_parameter_bytes(setup, shard), gradients=0, moments=0,
                      batch=batch, attention=attention, step="eval step", data=name))
  return max(needs, key=lambda n: n.total)


def _parameter_bytes(setup: Setup, shard) -> int:
  return sum(p.repeats * shard(p.shape, p.axes) * p.dtype.itemsize
             for p in setup.model.parameter_shapes())


def _moment_bytes(optimizer: Any, elements: int, dtype: Any) -> int:
  """The optimizer's moments of `elements` trained parameters of `dtype`, in bytes (each of
  the parameter's dtype, or of `optimizer.moment_dtype`'s)."""
  itemsize = getattr(optimizer, "moment_itemsize", lambda d: d.itemsize)(dtype)
  return getattr(optimizer, "moments_per_parameter", 2) * elements * itemsize


def _trained_and_frozen_bytes(setup: Setup, shard) -> tuple[int, int, int]:
  """(the trained parameters' bytes, the frozen ones', the trained ones' optimizer moments')
  per device: the model's and none; a LoRA job's float32 adapters and its base (its weight
  matrices int8 with their scales under "int8_weights": QLoRA); a full fine-tune's parameters
  and, where its objective needs a reference (DPO), the reference's copy of them."""
  model, train, optimizer = setup.model, setup.train, setup.optimizer
  if train.lora is None:
    parameters = _parameter_bytes(setup, shard)
    moments = sum(_moment_bytes(optimizer, p.repeats * shard(p.shape, p.axes), p.dtype)
                  for p in model.parameter_shapes())
    return parameters, parameters if train.objective.needs_reference else 0, moments
  from lingvo_lite.models import lora  # pylint: disable=g-import-not-at-top
  elements = sum(shard(shape, axes) for _, axes, shape in
                 lora.adapter_shapes(model, train.lora, setup.train_data.sequence_length))
  adapters, moments = 4 * elements, _moment_bytes(optimizer, elements, np.dtype(np.float32))
  if model.quantization != "int8_weights":
    return adapters, _parameter_bytes(setup, shard), moments
  contractions = model.int8_weight_contractions()
  frozen = 0
  for p in model.parameter_shapes():
    bare = p.axes[1:] if p.axes[:1] == ("layers",) else p.axes
    if bare not in contractions:
      frozen += p.repeats * shard(p.shape, p.axes) * p.dtype.itemsize
      continue
    scale = tuple(1 if name in contractions[bare] else size
                  for size, name in zip(p.shape, p.axes))
    frozen += p.repeats * (shard(p.shape, p.axes)
                           + shard(scale, p.axes) * p.dtype.itemsize)
  return adapters, frozen, moments


def host_available_bytes() -> int | None:
  """Memory the kernel could give this process now (MemAvailable), or None if unknown."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError, AttributeError):
    return None


def _count(n: int) -> str:
  return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def _gib(n: int) -> str:
  """Bytes in GiB, in MiB below 1 GiB, or in a larger binary unit where GiB would need an
  exponent."""
  if n < _GIB:
    return f"{n / 2**20:.3g} MiB"
  for unit in ("GiB", "TiB", "PiB", "EiB"):
    if n < 1000 * _GIB or unit == "EiB":
      return f"{n / _GIB:.3g} {unit}"
    n //= 1024
  raise AssertionError("unreachable")


@dataclasses.dataclass(frozen=True)
class _Memory:
  """What this process's devices hold, as every check compares a need with it.

  Attributes:
    copies: How many devices' needs share `available` (a CPU's devices share the host's RAM;
      an accelerator has its own).
    available: Bytes the devices can hold, or None where the runtime does not say.
    holder: Whose memory it is, for a message: "this host's RAM for 8 CPU device(s)" or
      "each NVIDIA H200".
    on_host: Whether it is the host's RAM.
  """

  copies: int
  available: int | None
  holder: str
  on_host: bool

  def fits(self, per_device: int) -> bool:
    return self.available is None or per_device * self.copies <= self.available


def _local_memory() -> _Memory:
  devices = jax.local_devices()
  if devices[0].platform == "cpu":
    return _Memory(len(devices), host_available_bytes(),
                   f"this host's RAM for {len(devices)} CPU device(s)", on_host=True)
  limits = [limit for limit in map(targets.device_limit_bytes, devices) if limit]
  return _Memory(1, min(limits) if limits else None, f"each {devices[0].device_kind}",
                 on_host=False)


def check_fits(setup: Setup) -> None:
  """Raises UsageError when training `setup` cannot fit this process's devices."""
  _check(setup, per_device_need, "training")


def check_eval_fits(setup: Setup) -> None:
  """Raises UsageError when evaluating `setup` (the eval program) cannot fit this process's
  devices; `setup.eval_data` must be set."""
  _check(setup, eval_need, "eval")


def _check(setup: Setup, need_of: Callable[[Setup, int], Need], program: str) -> None:
  memory = _local_memory()
  need = need_of(setup, targets.current().num_devices)
  if memory.fits(need.total):
    return
  copies, available = memory.copies, memory.available
  needed = need.total * copies
  where = (memory.holder, f"{_gib(available)} is available" if memory.on_host
           else f"it has {_gib(available)}")
  parts = [("parameters", need.parameters), ("frozen parameters", need.frozen),
           ("gradients", need.gradients), ("optimizer moments", need.moments),
           ("batch and logits", need.batch), ("attention scores", need.attention)]
  breakdown = " + ".join(f"{name} {_gib(size)}" for name, size in parts if size)
  if need.host_moments:
    breakdown += f"; optimizer moments in host memory {_gib(need.host_moments)}"
  model, activations = setup.model, need.batch + need.attention
  data = dict(setup.data_sources())[need.data]
  # The fixes for each part that is too large alone, else for the larger part.
  state_too_large = need.state * copies > available
  activations_too_large = activations * copies > available
  fixes = []
  if state_too_large or (not activations_too_large and need.state >= activations):
    fixes.append("use fewer layers (model.num_layers) or a smaller model.dim, more devices, "
                 "or shard the weights over them (FSDP: --fdl.partitioner.ici_fsdp=-1 "
                 "--fdl.partitioner.ici_data=1)" + _moment_fixes(setup, need, memory))
  if activations_too_large or (not state_too_large and activations > need.state):
    fix = f"use a smaller {need.data}.global_batch_size or {need.data}.sequence_length"
    if need.data != "train_data":
      fix += f" (more {need.data}.num_batches keep the tokens evaluated)"
    elif setup.train.grad_accum_steps * 2 <= data.global_batch_size:
      fix += ", more train.grad_accum_steps"
    fix += ", or more devices"
    scoreless = model.attention_choice().scoreless if need.attention else ()
    if scoreless:
      fix += (f"; model.attention_implementation={' or '.join(map(repr, scoreless))} never "
              "holds the attention scores")
    fixes.append(fix)
  raise UsageError(
      f"model: {_count(model.num_parameters())} parameters (num_layers={model.num_layers}, "
      f"dim={model.dim}) with {need.data} batches of {data.global_batch_size} x "
      f"{data.sequence_length} tokens do not fit: {program} needs at least {_gib(needed)} of "
      f"{where[0]} (per device, in one {need.step}: {breakdown}) and {where[1]}; "
      f"{'; '.join(fixes)}")


def _moment_fixes(setup: Setup, need: Need, memory: _Memory) -> str:
  """The optimizer's settings that would take moments off the device, where they hold some:
  bfloat16 moments, and (with a host apart from the devices) offloading them."""
  optimizer = setup.optimizer
  fixes = []
  if need.moments and getattr(optimizer, "moment_dtype", "") is None:
    fixes.append("--fdl.optimizer.moment_dtype='bfloat16' (half the moments' bytes)")
  if need.moments and not memory.on_host and hasattr(optimizer, "offload_state"):
    fixes.append("--fdl.optimizer.offload_state=True (the moments in host memory)")
  return f"; or {' or '.join(fixes)}" if fixes else ""


def decode_need(setup: Setup, num_devices: int) -> dict[str, int]:
  """The decode program's lower bound per device, by part: the parameters, the KV cache
  (decode.slots x decode.cache_length), the slots' tokens and log-probabilities, and the
  largest prefill's float32 attention scores and last logits."""
  shard = _sharder(setup, num_devices)
  model, settings = setup.model, setup.decode
  length = settings.resolved_cache_length(model.max_length)
  bucket = settings.resolved_buckets(model.max_length)[-1]
  slots = settings.slots
  return {
      "parameters": _parameter_bytes(setup, shard),
      "KV cache": model.cache_bytes(slots, length, shard),
      "tokens and log-probabilities": 8 * shard((slots, length), ("batch", "length")),
      "prefill scores and logits": 4 * (
          shard(*model.attention_scores_shape(slots, bucket))
          + shard((slots, model.vocab_size), ("batch", "vocab"))),
  }


def check_decode_fits(setup: Setup) -> None:
  """Raises UsageError when the decode program's state cannot fit this process's devices,
  before any of it is allocated."""
  memory = _local_memory()
  need = decode_need(setup, targets.current().num_devices)
  if memory.fits(sum(need.values())):
    return
  available = memory.available
  needed = sum(need.values()) * memory.copies
  where = (f"{memory.holder} ({_gib(available)} available)" if memory.on_host
           else f"{memory.holder} ({_gib(available)})")
  settings = setup.decode
  breakdown = " + ".join(f"{name} {_gib(size)}" for name, size in need.items() if size)
  raise UsageError(
      f"decode.slots={settings.slots}, decode.cache_length="
      f"{settings.resolved_cache_length(setup.model.max_length)}: decoding needs at least "
      f"{_gib(needed)} of {where} (per device: {breakdown}); use fewer decode.slots or a "
      "shorter decode.cache_length (or decode.prefill_buckets), or more devices")
