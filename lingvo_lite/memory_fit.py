"""Whether a training state fits this host's devices, judged from shapes before allocating it.

A config can be valid and still far too large for the machine at hand: Llama-7B's float32
parameters, gradients and Adam moments are 108 GB. Allocating it anyway fails late, as an
out-of-memory abort in C++ (or, on a CPU host, by swapping the machine to a halt). The train
program asks here first and refuses with one line naming the sizes and the fixes.

The count is a lower bound: each device's shard of the parameters, their gradients and the
optimizer's moments (`model.parameter_shapes()`, split as the partitioner's rules split
them), plus the batch and the float32 logits of one micro-batch. Other activations, which
remat policies trade, are not counted. A CPU's devices share the host's RAM, so their needs
add up; an accelerator is compared with its own memory (`memory_stats()["bytes_limit"]`).
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax

from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup

_GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Need:
  """Bytes one device needs for training, by what they hold."""

  parameters: int
  gradients: int
  moments: int
  batch: int

  @property
  def total(self) -> int:
    return self.parameters + self.gradients + self.moments + self.batch


def _ceil_div(a: int, b: int) -> int:
  return -(-a // b)


def per_device_need(setup: Setup, num_devices: int) -> Need:
  """The lower bound described above, for one of `num_devices` devices of the mesh."""
  partitioner = setup.partitioner
  axis_sizes = partitioner.mesh_axis_sizes(num_devices)

  def shard(shape, axes) -> int:
    ways = [math.prod(axis_sizes[a] for a in mesh_axes)
            for mesh_axes in partitioner.mesh_axes_of(axes)]
    return math.prod(_ceil_div(size, way) for size, way in zip(shape, ways))

  parameter_bytes = sum(p.repeats * shard(p.shape, p.axes) * p.dtype.itemsize
                        for p in setup.model.parameter_shapes())
  moments = getattr(setup.optimizer, "moments_per_parameter", 2)

  def batch_bytes(data, rows: int) -> int:
    # int32 inputs and targets and float32 weights, and the float32 logits of `rows` rows.
    return (12 * shard((data.global_batch_size, data.sequence_length), ("batch", "length"))
            + 4 * shard((rows, data.sequence_length, setup.model.vocab_size),
                        ("batch", "length", "vocab")))

  train = setup.train_data
  batches = [batch_bytes(train, train.global_batch_size // setup.train.grad_accum_steps)]
  if setup.eval_data is not None:
    batches.append(batch_bytes(setup.eval_data, setup.eval_data.global_batch_size))
  # A train and an eval batch are never held at the same time.
  return Need(parameters=parameter_bytes, gradients=parameter_bytes,
              moments=moments * parameter_bytes, batch=max(batches))


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


def device_limit_bytes(device: jax.Device) -> int | None:
  """An accelerator's memory for arrays, or None when its runtime does not say."""
  try:
    stats = device.memory_stats() or {}
  except Exception:  # pylint: disable=broad-except
    return None  # Some backends do not implement memory_stats at all.
  limit = stats.get("bytes_limit")
  return int(limit) if limit else None


def _gib(n: int) -> str:
  """Bytes in GiB, or in a larger binary unit where GiB would need an exponent."""
  for unit in ("GiB", "TiB", "PiB", "EiB"):
    if n < 1000 * _GIB or unit == "EiB":
      return f"{n / _GIB:.3g} {unit}"
    n //= 1024
  raise AssertionError("unreachable")


def check_fits(setup: Setup) -> None:
  """Raises UsageError when the training state cannot fit this process's devices."""
  devices = jax.local_devices()
  need = per_device_need(setup, jax.device_count())
  if devices[0].platform == "cpu":
    needed, available = need.total * len(devices), host_available_bytes()
    where = (f"this host's RAM for {len(devices)} CPU device(s)", f"{_gib(available or 0)} "
             "is available")
  else:
    limits = [limit for limit in map(device_limit_bytes, devices) if limit]
    needed, available = need.total, min(limits) if limits else None
    where = (f"each {devices[0].device_kind}", f"it has {_gib(available or 0)}")
  if available is None or needed <= available:
    return
  model = setup.model
  raise UsageError(
      f"model: {model.num_parameters() / 1e9:.3g}B parameters (num_layers={model.num_layers}, "
      f"dim={model.dim}) do not fit: training needs at least {_gib(needed)} of {where[0]} "
      f"(per device: parameters {_gib(need.parameters)} + gradients {_gib(need.gradients)} + "
      f"optimizer moments {_gib(need.moments)} + batch and logits {_gib(need.batch)}) and "
      f"{where[1]}; use fewer layers (model.num_layers) or a smaller model.dim, more devices, "
      "or shard the weights over them (FSDP: --fdl.partitioner.ici_fsdp=-1 "
      "--fdl.partitioner.ici_data=1); a smaller batch or more train.grad_accum_steps shrink "
      "the logits")
