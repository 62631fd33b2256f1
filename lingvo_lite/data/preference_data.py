"""Batches of preference pairs for DPO, packed whole: a pair never splits across rows.

A preference store (tasks/formats/preference.py) holds each pair as two consecutive documents,
chosen then rejected. Text is packed by cutting the token stream into windows (data/packing.py),
which would cut pairs; here the pairs are packed into rows of `sequence_length` tokens greedily,
in store order: a row takes the next pairs while both their sequences fit, and the rest of the
row is padding. Within a row each sequence is its own segment (document masking, positions from
0), so segment 2p + 1 is the row's pair p's chosen sequence and 2p + 2 its rejected one, which is
how training/objectives/dpo.py reads a batch. A pair longer than a row (both sequences
together) cannot be packed: it is left out, and the count is said once, in one line, when the
source is checked.

The rows are fixed by the store and the length alone (their token ranges are computed once from
the store's document starts: O(pairs) memory, small beside the store), and each epoch visits them
in a keyed permutation, as `TokenStoreData` visits windows: resume is exact, and a global row is
the same whatever the number of processes.

A store's pairs whose chosen and rejected sides are the same tokens (counted by the build:
data/store_build.py's `equal_pair`) give DPO nothing to learn; `equal_pairs_warning` says how
many, once, when the source is checked (and bin/build_store.py says it after its summary).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar

import numpy as np
from absl import logging

from lingvo_lite.data.packing import packed_batch
from lingvo_lite.data.source import Batch, local_rows, resolve_global_batch_size
from lingvo_lite.data.store_data import StoreStream, _token_bytes, metric_functions
from lingvo_lite.data.store_data import packed_batch_spec
from lingvo_lite.errors import DataError, config_error, shown
from lingvo_lite.fields import Int32Size, PositiveInt


def _row_ranges(starts: np.ndarray, num_tokens: int, sequence_length: int
                ) -> tuple[np.ndarray, np.ndarray, int, int]:
  """(each row's first token, its token count, the pairs packed, the pairs left out), for
  pairs whose documents start at `starts` (chosen, rejected, chosen, ...)."""
  ends = np.append(starts[1:], num_tokens)
  pair_lengths = (ends - starts)[0::2] + (ends - starts)[1::2]
  pair_starts = starts[0::2]
  row_starts, row_lengths = [], []
  fill, dropped = 0, 0
  for start, length in zip(pair_starts.tolist(), pair_lengths.tolist()):
    if length > sequence_length:
      dropped += 1
      fill = 0  # The next pair starts a row: rows are contiguous ranges of the stream.
      continue
    if fill and fill + length <= sequence_length and row_starts[-1] + fill == start:
      row_lengths[-1] += length
      fill += length
    else:
      row_starts.append(start)
      row_lengths.append(length)
      fill = length
  return (np.asarray(row_starts, np.int64), np.asarray(row_lengths, np.int64),
          len(pair_starts) - dropped, dropped)


def equal_pairs_warning(manifest: dict[str, Any], where: str) -> str | None:
  """The warning for a preference store whose manifest counts pairs with equal sides, or
  None (none, or a store built before they were counted)."""
  equal, pairs = manifest.get("equal_pairs"), manifest.get("documents", 0) // 2
  if not isinstance(equal, int) or not equal:
    return None
  return (f"{where}: {equal:,} of {pairs:,} preference pairs have 'chosen' equal to "
          "'rejected' once templated and tokenized; DPO learns nothing from them "
          "(--skip_bad_records drops them)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreferenceStoreData(StoreStream):
  """Rows of whole preference pairs from a preference store (see the module doc).

  Attributes (beyond StoreStream's: its task must be a preference task):
    sequence_length: Tokens per row.
    global_batch_size: Rows per step over all processes.
    per_device_batch_size: Alternatively, rows per device (global = this x devices).
    num_batches: Batches in one eval pass; None for an endless stream (or, for an eval set,
      the whole split).
  """

  sequence_length: Annotated[int, Int32Size]
  global_batch_size: PositiveInt | None = None
  per_device_batch_size: PositiveInt | None = None
  num_batches: PositiveInt | None = None

  # What a DPO objective and an eval pass ask a source for (training/objectives/dpo.py's layout).
  document_pairs: ClassVar[bool] = True

  def __post_init__(self):
    super().__post_init__()
    if not getattr(self.task, "document_pairs", False):
      raise config_error("task", getattr(self.task, "name", self.task), "holds documents, "
                         "not preference pairs", "give a task of the preference format "
                         "(bin/build_store.py --format=preference)")
    object.__setattr__(self, "global_batch_size", resolve_global_batch_size(
        self.global_batch_size, self.per_device_batch_size))

  def _rows(self) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The rows (`_row_ranges`), computed once per source."""
    cached = self.__dict__.get("_row_cache")
    if cached is None:
      store = self.store()
      starts = store.document_starts()
      if len(starts) % 2:
        raise DataError(f"{store.path}: holds {len(starts)} documents, an odd number: not "
                        "whole preference pairs; delete it to rebuild it")
      cached = _row_ranges(starts, store.num_tokens, self.sequence_length)
      object.__setattr__(self, "_row_cache", cached)
    return cached

  def num_examples(self, sequence_length: int) -> int:
    del sequence_length  # The rows are this source's own.
    return len(self._rows()[0])

  def examples_per_pass(self) -> int:
    return self.num_examples(self.sequence_length)

  def check(self) -> None:
    """Builds (or checks) the store, packs its pairs (one line saying how many did not fit);
    refuses a store none of whose pairs fit, or an eval pass longer than the split."""
    metric_functions(self.task)
    warning = equal_pairs_warning(self.store().manifest, f"{self.task.name}/{self.split}")
    if warning:
      logging.warning("%s", warning)
    rows, _, packed, dropped = self._rows()
    if not packed:
      raise config_error("sequence_length", self.sequence_length, f"every one of the {dropped} "
                         "preference pairs is longer (chosen and rejected together)",
                         "raise it")
    if dropped:
      logging.warning("%s/%s: %d of %d preference pairs are longer than sequence_length=%d "
                      "(chosen and rejected together) and are left out", self.task.name,
                      self.split, dropped, packed + dropped, self.sequence_length)
    if self.num_batches and self.num_batches * self.global_batch_size > len(rows):
      raise config_error("num_batches", self.num_batches, f"x global_batch_size "
                         f"{self.global_batch_size} is more than the split's {len(rows):,} rows "
                         "of pairs (some would count twice)",
                         f"use num_batches <= {max(len(rows) // self.global_batch_size, 1)}")

  def batch_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
    return packed_batch_spec(self.global_batch_size, self.sequence_length)

  @property
  def token_bytes(self) -> np.ndarray | None:
    return _token_bytes(self.task)

  def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> Batch:
    rows = local_rows(self.global_batch_size, process_index, process_count)
    chosen = self.examples_at(step * self.global_batch_size + rows, self.sequence_length)
    starts, lengths, _, _ = self._rows()
    try:
      tokens, weights, document_start, _ = self.store().read(starts[chosen],
                                                             self.sequence_length)
    except DataError as e:
      raise DataError(f"{e} (rows {shown(sorted(set(chosen.tolist()))[:4])} of pairs of "
                      f"{self.task.name}/{self.split})") from None
    return packed_batch(tokens, weights, document_start, lengths[chosen])

  @property
  def metric_fns(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    return (), ()
