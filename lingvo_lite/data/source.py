"""The contract every data source meets, and the index arithmetic they share.

A source is deterministic: `batch(step, process_index, process_count)` returns this process's
rows of global batch number `step`. Global row r of step s is the same example whatever the
number of processes, which makes resume exact and multi-host runs equal to single-host ones.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import numpy as np

from lingvo_lite.errors import UsageError, config_error

# The start of a `config_error` message: `field=value: ...`.
_FIELD_FIRST = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*|\[\d+\])*=")

Batch = dict[str, np.ndarray]


class DataSource(Protocol):
  """What the programs need from a data source."""

  global_batch_size: int  # Resolved at construction, also when given per device.
  sequence_length: int
  # Batches in one pass over an eval set; None for an endless (training) stream.
  num_batches: int | None
  # A source that knows its token ids lie in [0, vocab_size) also has `vocab_size` (a field
  # or a property); `Setup.validate()` then checks that the model's vocabulary covers it.

  def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> Batch:
    """Rows [process_index * B/P, (process_index + 1) * B/P) of global batch `step`."""
    ...

  def batch_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shape and dtype name of each array of one global batch, without reading any data:
    what the AOT compile shapes the step with (`lm_batch_spec` for plain LM examples)."""
    ...

  # An eval source that knows how many examples one pass over its split holds also has
  # `examples_per_pass()`: an eval set with `num_batches=None` then evaluates the whole split
  # (the last batch's rows past the end weigh 0). A source whose tokens come from a known
  # vocabulary has `vocabulary_fingerprint` (`vocabulary.fingerprint`'s string): eval sets
  # must share the train data's.

  # A source whose data can turn out unusable only once it is read (a seqio split with no
  # example of the sequence length) also has `check()`, which reads it (or what it needs of
  # it) and raises a UsageError naming its own field; `check_ready` calls it.


def check_ready(name: str, source: DataSource | None) -> None:
  """Runs the source's `check()`, if it has one, before a program writes or allocates.

  A program's batches are made on a background thread, mid-run; a problem met there would
  come after the job dir was written. `check()` reads the data first (a seqio source caches
  what it read, so the run does not read it again).

  Args:
    name: The source's config path (`train_data`), put in front of the field it names.
    source: The data source; None (no eval data) checks nothing.

  Raises:
    UsageError: `train_data.sequence_length=1024: ...`.
  """
  check = getattr(source, "check", None)
  if check is None:
    return
  try:
    check()
  except UsageError as e:
    raise under(name, e) from None


def vocabulary_fingerprint(source: DataSource | None) -> str | None:
  """The source's `vocabulary_fingerprint`, or None where it does not say."""
  fingerprint = getattr(source, "vocabulary_fingerprint", None)
  return fingerprint if isinstance(fingerprint, str) else None


def text_vocabulary(source: DataSource | None) -> Any:
  """The seqio vocabulary that turns the source's ids into text and back, or None for a
  source without text (synthetic ids, pre-tokenized data with a pass-through vocabulary)."""
  vocabulary = getattr(source, "text_vocabulary", None)
  if vocabulary is None or type(vocabulary).__name__ == "PassThroughVocabulary":
    return None
  return vocabulary


def under(path: str, error: UsageError) -> UsageError:
  """A part's error, named from its owner: `sequence_length=64: ...` of the part at
  `train_data` becomes `train_data.sequence_length=64: ...`."""
  message = str(error)
  return UsageError(f"{path}.{message}" if _FIELD_FIRST.match(message) else f"{path}: {message}")


def lm_batch_spec(global_batch_size: int, sequence_length: int
                  ) -> dict[str, tuple[tuple[int, ...], str]]:
  """The batch of unpacked LM examples: int32 inputs and targets, float32 loss weights."""
  shape = (global_batch_size, sequence_length)
  return {"inputs": (shape, "int32"), "targets": (shape, "int32"), "weights": (shape, "float32")}


def resolve_global_batch_size(global_batch_size: int | None,
                              per_device_batch_size: int | None) -> int:
  """The global batch from exactly one of the two ways to give it.

  A per-device batch counts every device (as MaxText's does), so with tensor parallelism
  the devices of one tensor group each "see" the same rows.

  Raises:
    UsageError: naming `global_batch_size` (relative to the source, which the builder
      prefixes with the source's config path) unless exactly one is given.
  """
  if (global_batch_size is None) == (per_device_batch_size is None):
    raise config_error("global_batch_size", global_batch_size,
                       "give exactly one of global_batch_size and per_device_batch_size "
                       f"(per_device_batch_size={per_device_batch_size!r})",
                       "set the other one to None")
  if global_batch_size is not None:
    return global_batch_size
  from lingvo_lite import target  # pylint: disable=g-import-not-at-top
  # The active target's devices: a compile for v5e-256 resolves against 256 chips.
  return per_device_batch_size * target.current().num_devices


def local_rows(global_batch_size: int, process_index: int, process_count: int) -> np.ndarray:
  """Global row indices this process owns."""
  if global_batch_size % process_count:
    raise config_error("global_batch_size", global_batch_size,
                       f"not divisible by {process_count} processes",
                       f"use a multiple of {process_count}")
  per_process = global_batch_size // process_count
  return np.arange(process_index * per_process, (process_index + 1) * per_process)


def example_indices(step: int, rows: np.ndarray, global_batch_size: int, num_examples: int,
                    seed: int, shuffle: bool) -> np.ndarray:
  """Indices into a fixed example table for the given global rows of batch `step`.

  Walks the table epoch after epoch; with `shuffle`, each epoch is a fresh permutation
  seeded by (seed, epoch), so any step's batch is computed without replaying earlier ones.
  """
  positions = step * global_batch_size + rows
  epochs, offsets = np.divmod(positions, num_examples)
  if not shuffle:
    return offsets
  indices = np.empty_like(offsets)
  for epoch in np.unique(epochs):
    permutation = np.random.default_rng([seed, int(epoch)]).permutation(num_examples)
    selected = epochs == epoch
    indices[selected] = permutation[offsets[selected]]
  return indices
