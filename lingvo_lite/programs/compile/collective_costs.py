"""What a collective of an optimized HLO module costs: the bytes its algorithm moves per
device over the ICI links or the data-center network (DCN) its device groups cross.

Bytes per device, for an input of B bytes per device in a group of n:

  all-reduce          2 (n - 1) / n x B   (a ring: reduce-scatter, then all-gather)
  all-gather          (n - 1) x B         (the gathered array's (n - 1) / n)
  reduce-scatter      (n - 1) / n x B
  all-to-all          (n - 1) / n x B
  collective-permute  B
  collective-broadcast  B

Links: within a slice a group whose devices differ along k torus axes runs a bidirectional ring
on each, 2k links of the chip's ICI bandwidth (at most its ports); a permute uses one. A group
spanning s slices with m devices in each runs hierarchically: its slice-local part over ICI (the
formula at n = m), then across slices at the chip's DCN bandwidth on the formula at n = s, with
the reductions' bytes divided among the m devices of a slice (each sends its 1/m). The device
ids in replica groups are the program's logical ids: positions in the mesh's device order.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

from lingvo_lite import chips
from lingvo_lite.programs.compile import hlo_text
from lingvo_lite.programs.compile.hlo_text import Instruction

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
         "collective-broadcast")
_REDUCING = ("all-reduce", "reduce-scatter")


@dataclasses.dataclass(frozen=True)
class Network:
  """Where a program's devices sit, by logical id: slice and torus coordinates."""

  slices: tuple[int, ...]
  coords: tuple[tuple[int, ...] | None, ...]

  slice_count: int = 1

  @classmethod
  def of(cls, devices: Sequence[Any], partitions: int | None = None) -> "Network":
    """The network of `devices` in the program's order (the mesh's, flattened). A
    multi-slice program is partitioned over one slice's devices (`partitions` of them: its
    replica groups name those), and crosses slices through the DCN runtime's transfers."""
    slices = [int(getattr(d, "slice_index", 0) or 0) for d in devices]
    count = len(set(slices)) or 1
    if partitions and partitions < len(devices):
      devices = [d for d, s in zip(devices, slices) if s == slices[0]][:partitions]
      slices = slices[:1] * len(devices)
    return cls(tuple(slices), tuple(tuple(c) if (c := getattr(d, "coords", None)) is not None
                                    else None for d in devices), count)

  @property
  def size(self) -> int:
    return len(self.slices)


@dataclasses.dataclass(frozen=True)
class Transfer:
  """A collective's bytes per device and seconds, over ICI and over DCN."""

  kind: str
  group_size: int
  ici_bytes: float
  dcn_bytes: float
  ici_seconds: float
  dcn_seconds: float
  dcn_known: bool = True


def kind_of(opcode: str) -> str | None:
  """The collective an opcode is (`all-reduce-start` is an all-reduce), or None."""
  base = opcode[:-len("-start")] if opcode.endswith("-start") else opcode
  return base if base in KINDS else None


def factor(kind: str, n: int) -> float:
  """Bytes moved per device over input bytes per device, for a group of n."""
  if n <= 1:
    return 0.0
  return {"all-reduce": 2.0 * (n - 1) / n, "all-gather": float(n - 1),
          "reduce-scatter": (n - 1) / n, "all-to-all": (n - 1) / n}.get(kind, 1.0)


def input_bytes(module: hlo_text.Module, instruction: Instruction) -> float:
  """Bytes per device of the collective's inputs (its operands, as stored unpadded)."""
  total = 0.0
  for name in instruction.operands:
    operand = module.instructions.get(name)
    for array in operand.shape if operand is not None else []:
      total += array.logical_bytes
  return total


def _axes_spanned(members: Sequence[int], network: Network) -> int:
  coords = [network.coords[d] for d in members if d < network.size]
  if len(coords) < 2 or any(c is None for c in coords):
    return 1 if len(members) > 1 else 0
  return sum(len({c[axis] for c in coords}) > 1 for axis in range(len(coords[0])))


def transfer(module: hlo_text.Module, instruction: Instruction, kind: str,
             network: Network, chip: chips.Chip) -> Transfer:
  """The bytes and seconds of one collective (`kind`: one of KINDS)."""
  size = input_bytes(module, instruction)
  if kind == "collective-permute":
    return _permute(instruction, size, network, chip)
  groups = hlo_text.replica_groups(instruction) or [list(range(network.size))]
  group = [d for d in groups[0] if d < network.size] or [0]
  slices = sorted({network.slices[d] for d in group})
  local = [d for d in group if network.slices[d] == slices[0]]
  m, s = len(local), len(slices)
  ici_bytes = factor(kind, m) * size
  links = min(max(2 * _axes_spanned(local, network), 2), chip.ici_links)
  dcn_bytes = factor(kind, s) * size / (m if kind in _REDUCING else 1)
  return _timed(kind, len(group), ici_bytes, dcn_bytes, links, chip)


def megascale_transfer(module: hlo_text.Module, send: Instruction, network: Network,
                       chip: chips.Chip) -> Transfer | None:
  """A multi-slice program's DCN collective: a `send` to the DCN runtime (XLA:TPU's
  megascale host transfer, its kind in `_xla_megascale_transfer_type`) across the program's
  slices, or None for any other send."""
  kind = re.search(r'_xla_megascale_transfer_type="(\w+)"', send.attributes)
  if not kind:
    return None
  name = kind.group(1).lower().replace("_", "-")
  name = name if name in KINDS else "all-reduce"
  size = input_bytes(module, dataclasses.replace(send, operands=send.operands[:1]))
  return _timed(name, network.slice_count, 0.0, factor(name, network.slice_count) * size, 2,
                chip)


def _permute(instruction: Instruction, size: float, network: Network,
             chip: chips.Chip) -> Transfer:
  pairs = [(a, b) for a, b in hlo_text.source_target_pairs(instruction)
           if a < network.size and b < network.size and a != b]
  if not pairs:
    return Transfer("collective-permute", 1, 0.0, 0.0, 0.0, 0.0)
  across = any(network.slices[a] != network.slices[b] for a, b in pairs)
  return _timed("collective-permute", 2, 0.0 if across else size, size if across else 0.0, 1,
                chip)


def _timed(kind: str, n: int, ici_bytes: float, dcn_bytes: float, links: int,
           chip: chips.Chip) -> Transfer:
  dcn = chip.dcn_bytes_per_s
  dcn_seconds = dcn_bytes / dcn.value if dcn is not None else 0.0
  return Transfer(kind, n, ici_bytes, dcn_bytes,
                  ici_bytes / (links * chip.ici_link_bytes_per_s.value), dcn_seconds,
                  dcn is not None or dcn_bytes == 0)
