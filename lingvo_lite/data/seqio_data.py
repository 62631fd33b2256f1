"""Batches from a seqio Task, materialized once and then indexed by (seed, step).

seqio runs the Task's preprocessors (tokenize, append EOS, chunk) and its LM feature
converter once per (task, split, length); the resulting fixed-length examples are kept as
NumPy arrays and every batch is picked from them by index (`source.example_indices`). This
trades memory (4 bytes a token) for exact, instant resume and for host sharding that does
not depend on the number of processes. seqio and TensorFlow are imported only here.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Annotated, Any, Mapping

import numpy as np

from lingvo_lite.data.source import (Batch, example_indices, lm_batch_spec, local_rows,
                                     resolve_global_batch_size, under)
from lingvo_lite.runtime.tensorflow_import import import_tensorflow
from lingvo_lite.errors import UsageError, config_error
from lingvo_lite.fields import Int32Size, NonNegativeInt, PositiveInt

# seqio LMFeatureConverter's output names -> lingvo_lite's batch keys.
_FEATURES = {"decoder_input_tokens": "inputs", "decoder_target_tokens": "targets",
             "decoder_loss_weights": "weights"}


@functools.lru_cache(maxsize=8)
def _materialize(task: Any, split: str, sequence_length: int,
                 max_examples: int | None) -> dict[str, np.ndarray]:
  import_tensorflow()
  import seqio  # pylint: disable=g-import-not-at-top
  try:
    dataset = task.get_dataset({"targets": sequence_length}, split=split, shuffle=False,
                               use_cached=False, num_epochs=1)
  except UsageError as e:  # The task's own (a split with no files): one of `task`'s fields.
    raise under("task", e) from None
  converter = seqio.LMFeatureConverter(pack=False)
  dataset = converter(dataset, {"targets": sequence_length})
  if max_examples:
    dataset = dataset.take(max_examples)
  parts = {key: [] for key in _FEATURES.values()}
  for batch in dataset.batch(4096).as_numpy_iterator():
    for source_key, key in _FEATURES.items():
      parts[key].append(batch[source_key])
  if not parts["inputs"]:
    # The split holds fewer tokens than one example (a short split, a long sequence): the
    # config's to fix, so a UsageError, named relative to the source (`check_ready` puts the
    # source's config path in front).
    raise config_error("sequence_length", sequence_length,
                       f"seqio task {task.name} split {split!r} produced no examples of "
                       f"{sequence_length} tokens", "use a shorter sequence_length or a split "
                       "with more data")
  return {
      "inputs": np.concatenate(parts["inputs"]).astype(np.int32),
      "targets": np.concatenate(parts["targets"]).astype(np.int32),
      "weights": np.concatenate(parts["weights"]).astype(np.float32),
  }


def _check_task(task: Any) -> None:
  """What `_materialize` needs of a task, checked when the source is built: a seqio Task with
  a `targets` feature, not None or another object (which would fail mid-run in the prefetch
  thread, with a traceback)."""
  if not callable(getattr(task, "get_dataset", None)):
    raise config_error("task", task, f"is a {type(task).__name__}, not a seqio Task (it has no "
                       "get_dataset())", "give a seqio.Task, e.g. fdl.Config(pycode_task) of "
                       "tasks.pycode")
  if isinstance(getattr(task, "vocab_size", None), int) and hasattr(task, "splits"):
    return  # Made on first use; its targets feature is checked when it is made.
  features = getattr(task, "output_features", None)
  if not isinstance(features, Mapping) or "targets" not in features:
    raise config_error("task", getattr(task, "name", task), "has no 'targets' output feature",
                       "a language-model task yields its tokens as 'targets'")


@dataclasses.dataclass(frozen=True)
class SeqioData:
  """Fixed-length LM examples from a seqio Task.

  Attributes:
    task: A `seqio.Task` whose `targets` feature yields examples of `sequence_length` tokens.
    split: The Task's split to read.
    sequence_length: Tokens per example.
    global_batch_size: Examples per step over all processes.
    per_device_batch_size: Alternatively, examples per device (global = this x devices).
    shuffle: Visit examples in a fresh permutation each epoch (seeded by (seed, epoch)).
    seed: Root of the shuffle.
    num_batches: Batches in one eval pass; None for an endless stream.
    max_examples: Keep only the first examples of the split (tests); None keeps all.
  """

  task: Any
  split: str
  sequence_length: Annotated[int, Int32Size]
  global_batch_size: PositiveInt | None = None
  shuffle: bool = True
  seed: NonNegativeInt = 0
  num_batches: PositiveInt | None = None
  max_examples: PositiveInt | None = None
  per_device_batch_size: PositiveInt | None = None

  def __post_init__(self):
    object.__setattr__(self, "global_batch_size", resolve_global_batch_size(
        self.global_batch_size, self.per_device_batch_size))
    _check_task(self.task)
    splits = tuple(getattr(self.task, "splits", None) or ())
    if splits and self.split not in splits:
      raise config_error("split", self.split, f"the task has no such split; valid choices: "
                         f"{', '.join(repr(s) for s in splits)}")

  @property
  def vocab_size(self) -> int | None:
    """Size of the `targets` feature's vocabulary (None when the task does not say); a task
    made on first use (tasks.pycode.DeferredTask) states it without being made."""
    declared = getattr(self.task, "vocab_size", None)
    if isinstance(declared, int):
      return declared
    try:
      return int(self.task.output_features["targets"].vocabulary.vocab_size)
    except (AttributeError, KeyError, TypeError):
      return None

  @property
  def text_vocabulary(self) -> Any:
    """The `targets` feature's seqio vocabulary."""
    return self.task.output_features["targets"].vocabulary

  @property
  def examples(self) -> dict[str, np.ndarray]:
    return _materialize(self.task, self.split, self.sequence_length, self.max_examples)

  def examples_per_pass(self) -> int:
    """Examples in the split (an eval set with num_batches=None reads them all)."""
    return len(self.examples["inputs"])

  def check(self) -> None:
    """Materializes the examples (once per process: they are cached), so that a split with
    no example of `sequence_length` tokens is refused before a program starts.

    Raises:
      UsageError: naming `sequence_length` (see `source.check_ready`).
    """
    _materialize(self.task, self.split, self.sequence_length, self.max_examples)

  def batch_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
    return lm_batch_spec(self.global_batch_size, self.sequence_length)

  def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> Batch:
    examples = self.examples
    rows = local_rows(self.global_batch_size, process_index, process_count)
    indices = example_indices(step, rows, self.global_batch_size, len(examples["inputs"]),
                              self.seed, self.shuffle)
    return {key: value[indices] for key, value in examples.items()}
