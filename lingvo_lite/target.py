"""What a program runs on: this host's devices, or the devices of a compile topology.

Shapes and validation never ask the live backend directly: batch resolution
(`per_device_batch_size`), `Setup.validate()`, the process-rows check, shardings and the
model's platform-specific code all read the active `Target`. Training runs on `host()`, the
default; the compile program activates the topology it compiles for, so a `v5e-256` compile on
this CPU host sees 256 TPU chips in 64 processes, and nothing of the host leaks into the step.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import sys
import tempfile
from typing import Any, Iterator, Sequence

from lingvo_lite import topologies
from lingvo_lite.errors import UsageError, shown

_GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Target:
  """Devices a program is shaped and compiled for.

  Attributes:
    name: `local`, `cpu:8`, `v5e-256`, ...: as the user named it.
    platform: "cpu", "gpu" or "tpu".
    devices: The devices, in the order meshes are built from (real devices for this host,
      topology devices for a TPU compile).
    memory_per_device: Bytes a device can use, or None where nothing says.
    memory_source: Where that number comes from (for reports).
    num_slices: TPU slices joined over the data-center network.
    peak_bf16_tflops: Datasheet peak per device, or None (then mfu.py decides).
    peak_int8_tops: Datasheet int8 peak per device, or None (none known: "int8" training's
      step time is then not estimated).
    is_host: Whether the devices are this process's own (programs can run on them).
  """

  name: str
  platform: str
  devices: tuple[Any, ...]
  memory_per_device: int | None
  memory_source: str
  num_slices: int = 1
  peak_bf16_tflops: float | None = None
  peak_int8_tops: float | None = None
  is_host: bool = True

  @property
  def num_devices(self) -> int:
    return len(self.devices)

  @property
  def num_processes(self) -> int:
    return len({d.process_index for d in self.devices})

  @property
  def device_kind(self) -> str:
    return self.devices[0].device_kind


_ACTIVE: contextvars.ContextVar[Target | None] = contextvars.ContextVar("target", default=None)


def current() -> Target:
  """The active target: the one a program activated, else this host's."""
  return _ACTIVE.get() or host()


def current_platform() -> str:
  """The active target's platform, without building a host target (for trace-time code)."""
  active = _ACTIVE.get()
  if active is not None:
    return active.platform
  import jax  # pylint: disable=g-import-not-at-top
  return jax.default_backend()


@contextlib.contextmanager
def active(target: Target) -> Iterator[Target]:
  """Makes `target` the one shapes, validation and tracing see."""
  token = _ACTIVE.set(target)
  try:
    yield target
  finally:
    _ACTIVE.reset(token)


def host_memory_bytes() -> int:
  """This host's RAM: the smaller of MemTotal and a cgroup limit (a container's)."""
  total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
    try:
      with open(path) as f:
        text = f.read().strip()
    except OSError:
      continue
    if text.isdigit():
      total = min(total, int(text))
  return total


def device_limit_bytes(device: Any) -> int | None:
  """An accelerator's memory for arrays, or None when its runtime does not say."""
  try:
    stats = device.memory_stats() or {}
  except Exception:  # pylint: disable=broad-except
    return None  # Some backends do not implement memory_stats at all.
  limit = stats.get("bytes_limit")
  return int(limit) if limit else None


def host(devices: Sequence[Any] | None = None, name: str = "local") -> Target:
  """This process's view of the run's devices (all processes' devices, in jax's order)."""
  import jax  # pylint: disable=g-import-not-at-top
  devices = tuple(devices if devices is not None else jax.devices())
  platform = devices[0].platform
  if platform == "cpu":
    # Virtual CPU devices share the host's RAM: each gets its share.
    local = sum(d.process_index == jax.process_index() for d in devices) or 1
    ram = host_memory_bytes()
    memory = ram // local
    source = f"this host's {ram / _GIB:.1f} GiB RAM shared by {local} CPU devices"
  else:
    memory = device_limit_bytes(devices[0])
    source = "the runtime's bytes_limit" if memory else "unknown (the runtime does not say)"
  return Target(name=name, platform=platform, devices=devices, memory_per_device=memory,
                memory_source=source)


def compile_target(name: str, num_slices: int = 1) -> Target:
  """The target `--compile_topology=name --compile_num_slices=num_slices` names.

  Raises:
    UsageError: an unknown name (listing the known ones), a slice count that is not positive
      or given for a topology without slices, or libtpu missing for a TPU name.
  """
  if not 1 <= num_slices <= topologies.MAX_SLICES:
    raise UsageError(f"--compile_num_slices={num_slices}: must be 1..{topologies.MAX_SLICES} "
                     "(slices joined over the data-center network)")
  cpu_count = topologies.cpu_devices(name)
  if name == "local" or cpu_count is not None:
    if num_slices != 1:
      raise UsageError(f"--compile_num_slices={num_slices}: only TPU topologies have slices; "
                       f"--compile_topology={name} is one slice (drop the flag, or name a TPU "
                       "topology such as v5e-16)")
    return host() if cpu_count is None else _cpu_target(name, cpu_count)
  tpu_slice = topologies.TPU_SLICES.get(name)
  if tpu_slice is None:
    close = topologies.close_name(name)
    hint = f"did you mean {close}? " if close else ""
    raise UsageError(f"--compile_topology={shown(name)}: unknown topology; {hint}known: "
                     f"{topologies.known_names()}")
  return _tpu_target(tpu_slice, num_slices)


def _cpu_target(name: str, count: int) -> Target:
  import jax  # pylint: disable=g-import-not-at-top
  if not 1 <= count <= topologies.MAX_CPU_DEVICES:
    raise UsageError(f"--compile_topology={name}: N must be 1..{topologies.MAX_CPU_DEVICES}")
  devices = jax.devices("cpu")
  if len(devices) < count:
    raise UsageError(
        f"--compile_topology={name}: this process has {len(devices)} CPU devices (XLA_FLAGS "
        f"or jax_num_cpu_devices was set before the executor could ask for {count}); unset "
        "XLA_FLAGS' --xla_force_host_platform_device_count or make it at least N")
  return host(devices[:count], name=name)


def _tpu_target(tpu_slice: topologies.TpuSlice, num_slices: int) -> Target:
  try:
    from jax.experimental import topologies as jax_topologies  # pylint: disable=g-import-not-at-top
    import libtpu  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise UsageError(
        f"--compile_topology={tpu_slice.name}: TPU compiles need the libtpu package, which is "
        "not installed; pip install 'lingvo_lite[tpu]' (libtpu matching this jax)") from None
  # libtpu takes /tmp/libtpu_lockfile so that two processes never drive one host's chips;
  # a compile drives none, and compiles side by side (parallel test shards, a sweep of
  # topologies) must not refuse each other.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  with _quiet_stderr():
    description = jax_topologies.get_topology_desc(
        platform="tpu", topology_name=tpu_slice.topology_name,
        chip_config_name=tpu_slice.generation.chip_config,
        chips_per_host_bounds=tpu_slice.chips_per_host_bounds, num_slices=num_slices)
  generation = tpu_slice.generation
  name = tpu_slice.name if num_slices == 1 else f"{tpu_slice.name} x {num_slices} slices"
  return Target(name=name, platform="tpu", devices=tuple(description.devices),
                memory_per_device=generation.memory_per_chip,
                memory_source=f"{generation.name} datasheet HBM per chip", num_slices=num_slices,
                peak_bf16_tflops=generation.peak_bf16_tflops,
                peak_int8_tops=generation.peak_int8_tops, is_host=False)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
  """libtpu writes warnings about the TPU VM it is not on (no metadata server, no worker
  hostnames) to file descriptor 2 while it builds a topology; they are kept out of the user's
  one-line contract and shown only if building the topology fails."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    except BaseException:
      os.dup2(saved, 2)
      captured.seek(0)
      sys.stderr.write(captured.read().decode(errors="replace"))
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def arrange_cpu_devices(count: int | None) -> None:
  """A target of `count` CPU devices (`--compile_topology=cpu:N`) needs them from JAX, which
  fixes their number when its backend starts: asked for before anything touches a device."""
  if not count or not 1 <= count <= topologies.MAX_CPU_DEVICES:
    return
  if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
    return  # The user's own count; the target takes the first N (or says there are too few).
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  if not xla_bridge.backends_are_initialized():
    jax.config.update("jax_num_cpu_devices", count)
