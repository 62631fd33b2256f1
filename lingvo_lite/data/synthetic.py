"""Synthetic token data for tests and benchmarks: free of TensorFlow and seqio imports."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import numpy as np

from lingvo_lite.fields import Int32Size, NonNegativeInt, PositiveInt, Range
from lingvo_lite.data.source import (Batch, lm_batch_spec, local_rows,
                                     resolve_global_batch_size)


@dataclasses.dataclass(frozen=True)
class SyntheticData:
  """Rows of a random motif repeated to the sequence length; a function of (seed, step, row).

  The repetition makes the data learnable (a model that copies from `period` tokens back
  drives the loss down), so a falling loss is a meaningful check.

  Attributes:
    vocab_size: Tokens are drawn from [1, vocab_size) (0 is left for padding).
    sequence_length: Tokens per row.
    global_batch_size: Rows per step over all processes.
    per_device_batch_size: Alternatively, rows per device (global = this x device count).
    seed: Root of the data's randomness.
    period: Length of the repeated motif; 0 gives uniformly random tokens.
    num_batches: Batches in one eval pass; None for an endless stream.
  """

  vocab_size: Annotated[int, Range(2, 2**31 - 1, note="ids are int32 and 0 is padding")]
  sequence_length: Annotated[int, Int32Size]
  global_batch_size: PositiveInt | None = None
  seed: NonNegativeInt = 0
  period: NonNegativeInt = 16
  num_batches: PositiveInt | None = None
  per_device_batch_size: PositiveInt | None = None

  def __post_init__(self):
    object.__setattr__(self, "global_batch_size", resolve_global_batch_size(
        self.global_batch_size, self.per_device_batch_size))

  def _row(self, step: int, row: int) -> np.ndarray:
    rng = np.random.default_rng([self.seed, step, row])
    length = self.sequence_length + 1
    if not self.period:
      return rng.integers(1, self.vocab_size, size=length, dtype=np.int32)
    motif = rng.integers(1, self.vocab_size, size=self.period, dtype=np.int32)
    return np.resize(motif, length)

  def batch_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
    return lm_batch_spec(self.global_batch_size, self.sequence_length)

  def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> Batch:
    rows = local_rows(self.global_batch_size, process_index, process_count)
    tokens = np.stack([self._row(step, int(row)) for row in rows])
    return {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "weights": np.ones((len(rows), self.sequence_length), np.float32),
    }
