"""Packing sequences of different lengths into rows of one length, each sequence whole in one
row (its own segment, so attention never crosses into a neighbour)."""

from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where one sequence sits: row `row`, from `offset`, segment id `segment` (from 1)."""

  row: int
  offset: int
  segment: int


def pack(lengths: Sequence[int], row_length: int) -> tuple[list[Placement], int]:
  """(each sequence's placement, in input order; the number of rows used).

  First fit, longest first: a few rows for many short sequences, and a sequence never waits
  behind a longer one for room. Every length must be in [1, row_length].
  """
  for length in lengths:
    if not 1 <= length <= row_length:
      raise ValueError(f"sequence length {length} is outside [1, {row_length}]")
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
  used: list[int] = []  # Tokens taken in each row.
  segments: list[int] = []  # Sequences placed in each row.
  placements: list[Placement | None] = [None] * len(lengths)
  for index in order:
    length = lengths[index]
    row = next((r for r, taken in enumerate(used) if taken + length <= row_length), None)
    if row is None:
      row = len(used)
      used.append(0)
      segments.append(0)
    segments[row] += 1
    placements[index] = Placement(row=row, offset=used[row], segment=segments[row])
    used[row] += length
  return placements, len(used)  # type: ignore[return-value]
