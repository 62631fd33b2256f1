"""The named compile topologies: Cloud TPU slice names and virtual CPU meshes.

A name says which chips a program is compiled for. TPU names follow Cloud TPU (and MaxText):
`<generation>-<N>`, where N counts TensorCores for v4 and v5p (two per chip, used as one
"megacore" device: `v4-8` is 4 chips) and chips for v5e and v6e (one TensorCore each: `v5e-8`
is 8 chips). `cpu:N` is N virtual CPU devices of this host, which share its RAM. `local` is
the devices this process sees (a GPU host, say).

TPU topologies are built by `jax.experimental.topologies` from libtpu (the `lingvo_lite[tpu]`
extra), which compiles for TPUs on a CPU host without any TPU attached.
"""

from __future__ import annotations

import dataclasses
import re

_GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Generation:
  """What every slice of one TPU generation shares.

  Attributes:
    name: The generation's prefix in slice names (`v5e`).
    topology_prefix: Its prefix in libtpu topology strings (`v5e` in `v5e:2x4`).
    chip_config: libtpu's chip configuration ("megacore": two TensorCores act as one device).
    cores_per_chip: TensorCores per chip that the slice name counts (2 for v4 and v5p).
    memory_per_chip: HBM bytes per chip.
    peak_bf16_tflops: Datasheet dense bfloat16 peak per chip.
    peak_int8_tops: Datasheet dense int8 peak per chip (v4's MXUs run int8 at the bfloat16
      rate: no speed-up there; v5e, v5p and v6e double it).
    single_host_chips: The largest slice one host drives (its chips form one process).
  """

  name: str
  topology_prefix: str
  chip_config: str
  cores_per_chip: int
  memory_per_chip: int
  peak_bf16_tflops: float
  peak_int8_tops: float
  single_host_chips: int


GENERATIONS = {
    "v4": Generation("v4", "v4", "megacore", 2, 32 * _GIB, 275.0, 275.0, 4),
    "v5e": Generation("v5e", "v5e", "default", 1, 16 * _GIB, 197.0, 394.0, 8),
    "v5p": Generation("v5p", "v5p", "megacore", 2, 95 * _GIB, 459.0, 918.0, 4),
    "v6e": Generation("v6e", "v6e", "default", 1, 32 * _GIB, 918.0, 1836.0, 8),
}

# Chip grids of the slice sizes Cloud TPU offers: 3D tori for v4/v5p, 2D for v5e/v6e.
_GRID_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
            128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16),
            2048: (8, 16, 16), 4096: (16, 16, 16)}
_GRID_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
            128: (8, 16), 256: (16, 16)}


@dataclasses.dataclass(frozen=True)
class TpuSlice:
  """One named TPU slice: `v5e-256` is 256 v5e chips in a 16x16 grid."""

  name: str
  generation: Generation
  grid: tuple[int, ...]

  @property
  def chips(self) -> int:
    count = 1
    for size in self.grid:
      count *= size
    return count

  @property
  def topology_name(self) -> str:
    """libtpu's name of the slice, `v5e:16x16`."""
    return f"{self.generation.topology_prefix}:{'x'.join(map(str, self.grid))}"

  @property
  def chips_per_host_bounds(self) -> tuple[int, int, int]:
    """The chip block one host drives: the whole slice up to a host's size, else libtpu's
    default of 2x2x1 (so `v5e-8` is one host of 8 chips, as Cloud sells it)."""
    if self.chips <= self.generation.single_host_chips:
      grid = tuple(self.grid) + (1,) * (3 - len(self.grid))
      return grid  # type: ignore[return-value]
    return (2, 2, 1)


def _slices() -> dict[str, TpuSlice]:
  table = {}
  for generation in GENERATIONS.values():
    grids = _GRID_3D if generation.cores_per_chip == 2 else _GRID_2D
    for chips, grid in grids.items():
      name = f"{generation.name}-{chips * generation.cores_per_chip}"
      table[name] = TpuSlice(name, generation, grid)
  return table


TPU_SLICES = _slices()
_CPU = re.compile(r"cpu:([0-9]{1,6})")
# More virtual CPU devices than this are a typo, not a mesh (XLA starts a thread per device).
MAX_CPU_DEVICES = 4096
# More slices than any multi-slice job joins (libtpu builds every device of every slice).
MAX_SLICES = 1024


def known_names() -> str:
  """The valid names grouped by generation, for error messages and --help."""
  groups = ["cpu:N (N virtual CPU devices)", "local (this host's devices)"]
  for generation in GENERATIONS.values():
    names = [s.name for s in TPU_SLICES.values() if s.generation is generation]
    unit = "TensorCores, 2 per chip" if generation.cores_per_chip == 2 else "chips"
    groups.append(f"{generation.name} ({unit}): {' '.join(names)}")
  return "; ".join(groups)


def cpu_devices(name: str) -> int | None:
  """N of `cpu:N`, or None when `name` is not of that form."""
  match = _CPU.fullmatch(name)
  return int(match.group(1)) if match else None


def close_name(name: str) -> str | None:
  """The known name `name` means, spelled otherwise (`V5E-8`, ` v5e-08`, `v5e_8`), or None."""
  match = re.fullmatch(r"\s*(v\d[a-z]?)[-_: ]?0*(\d+)\s*", name.lower())
  if not match:
    return None
  candidate = f"{match.group(1)}-{match.group(2)}"
  return candidate if candidate in TPU_SLICES and candidate != name else None
