"""Batches of packed examples from token stores: one task's, or a mixture of several.

A source's examples are windows of its store's token stream (`packing`), visited epoch after
epoch, each epoch in the order of a keyed permutation seeded by (seed, epoch). Global row r of
step s is stream position s * B + r whatever the number of processes, and each process reads
only its own rows' windows, so resume is exact and independent of the process count. The
store is built on first use (or refused, with `build=False`) and checked against its task
every time it is opened: a store whose files or vocabulary changed is never read.

Longer than 300 lines with a reason: one task's batches (`TokenStoreData`) and a mixture's
(`TokenStoreMixture`) are two readers of the same `StoreStream`, and share how a store is opened,
built on first use and checked against its task.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import threading
from typing import Annotated, Any, Sequence

import numpy as np
from etils import epath

from lingvo_lite import paths
from lingvo_lite.data import locations, task_facts, token_store, vocabulary
from lingvo_lite.data.packing import packed_batch
from lingvo_lite.data.permutation import KeyedPermutation
from lingvo_lite.data.source import Batch, local_rows, resolve_global_batch_size, under
from lingvo_lite.data.text_vocabulary import TextVocabulary
from lingvo_lite.errors import DataError, UsageError, config_error, shown
from lingvo_lite.fields import Int32Size, NonNegativeInt, PositiveInt

MIXTURE_BLOCK = 1000  # Rows per block of a mixture: each block holds each source's exact share.
_LOCK = threading.Lock()


def packed_batch_spec(global_batch_size: int, sequence_length: int
                      ) -> dict[str, tuple[tuple[int, ...], str]]:
  shape = (global_batch_size, sequence_length)
  return {"inputs": (shape, "int32"), "targets": (shape, "int32"), "weights": (shape, "float32"),
          "segment_ids": (shape, "int32"), "positions": (shape, "int32")}


def _check_task(task: Any, split: str) -> None:
  if not callable(getattr(task, "get_dataset", None)) or not hasattr(task, "name"):
    raise config_error("task", task, f"is a {type(task).__name__}, not a seqio Task",
                       "give a seqio.Task or a tasks.deferred.DeferredTask, e.g. "
                       "fdl.Config(pycode_task) of tasks.pycode")
  splits = tuple(getattr(task, "splits", None) or ())
  if splits and split not in splits:
    raise config_error("split", split, "the task has no such split; valid choices: "
                       f"{', '.join(repr(s) for s in splits)}")


def _store_path(store_dir: str | None, task: Any, split: str) -> epath.Path:
  if store_dir is None:
    return locations.data_root() / "stores" / task.name / split
  return paths.resolve(store_dir, "store_dir")  # Local paths made absolute, at the edge.


@functools.lru_cache(maxsize=32)
def _ready_store(task: Any, split: str, path: epath.Path, build: bool, workers: int | None
                 ) -> token_store.TokenStore:
  """The store of `task`'s `split` at `path`, built first if missing or stale (`build`)."""
  from lingvo_lite.data import store_build  # pylint: disable=g-import-not-at-top
  try:
    key = store_build.store_key(task, split)
  except UsageError as e:  # The task's own (a split with no files): one of `task`'s fields.
    raise under("task", e) from None
  manifest = token_store.read_manifest(path)
  if manifest is not None:
    difference = token_store.manifest_difference(key, manifest)
    if difference is None:
      return token_store.TokenStore(path, manifest)
    if not build:
      raise config_error("store_dir", str(path), f"the store is stale: {difference}",
                         "set build=True to rebuild it, or point store_dir elsewhere")
    print(f"rebuilding the token store at {path}: {difference}", file=sys.stderr, flush=True)
  elif not build:
    raise config_error("store_dir", str(path), "holds no token store",
                       "set build=True to build it on first use, or build it with "
                       "bin/build_store.py")
  # build_store waits for a concurrent builder of the same store and may return its work.
  manifest = store_build.build_store(task, split, path, workers=workers, key=key)
  _print_summary(path, manifest)
  return token_store.TokenStore(path, manifest)


def _print_summary(path: epath.Path, manifest: dict[str, Any]) -> None:
  shards = len(manifest["shards"])
  print(f"built the token store at {path}: {manifest['documents']:,} documents, "
        f"{manifest['tokens']:,} tokens ({manifest['dtype']}), {shards} "
        f"shard{'s' if shards != 1 else ''} in {manifest['build']['seconds']:.1f} s",
        file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class StoreStream:
  """One task's examples as an endless stream: position -> (epoch, example) -> window.

  Attributes:
    task: A seqio Task (or tasks.deferred.DeferredTask) yielding one document per example.
    split: The task's split.
    store_dir: Where its store lives; None: `locations.data_root()/stores/<task>/<split>`.
    build: Build the store on first use when it is missing or stale; False refuses.
    shuffle: Visit each epoch in a fresh permutation seeded by (seed, epoch).
    seed: Root of the shuffle.
    build_workers: Beam worker processes for a build (None: this process alone below
      store_build.IN_PROCESS_BYTES of input, else one per core).
  """

  task: Any
  split: str
  store_dir: str | None = None
  build: bool = True
  shuffle: bool = True
  seed: NonNegativeInt = 0
  build_workers: PositiveInt | None = None

  def __post_init__(self):
    _check_task(self.task, self.split)

  @property
  def path(self) -> epath.Path:
    return _store_path(self.store_dir, self.task, self.split)

  @property
  def vocab_size(self) -> int | None:
    declared = getattr(self.task, "vocab_size", None)
    return declared if isinstance(declared, int) else None

  @property
  def vocabulary_fingerprint(self) -> str | None:
    return _vocabulary_fingerprint(self.task)

  @property
  def text_vocabulary(self) -> Any:
    """What turns text into this store's ids and back: from the task's facts where it gives
    them (no seqio import: data/text_vocabulary.py), else the made Task's seqio vocabulary."""
    facts = task_facts.facts_of(self.task)
    if facts is not None:
      return TextVocabulary(facts.vocabulary)
    return self.task.output_features["targets"].vocabulary

  def store(self) -> token_store.TokenStore:
    with _LOCK:  # One build per process, whichever thread asks first.
      return _ready_store(self.task, self.split, self.path, self.build, self.build_workers)

  def num_examples(self, sequence_length: int) -> int:
    return -(-self.store().num_tokens // sequence_length)

  def examples_at(self, positions: np.ndarray, sequence_length: int) -> np.ndarray:
    """The example (window number) at each stream position."""
    count = self.num_examples(sequence_length)
    epochs, offsets = np.divmod(np.asarray(positions, dtype=np.int64), count)
    examples = offsets.copy()
    if self.shuffle:
      for epoch in np.unique(epochs):
        chosen = epochs == epoch
        examples[chosen] = KeyedPermutation(count, self.seed, int(epoch))(offsets[chosen])
    return examples

  def windows(self, positions: np.ndarray, sequence_length: int) -> Batch:
    """The packed examples at stream positions `positions`."""
    store = self.store()
    examples = self.examples_at(positions, sequence_length)
    try:
      return packed_batch(*store.read(examples * sequence_length, sequence_length))
    except DataError as e:
      raise DataError(f"{e} (examples {shown(sorted(set(examples.tolist()))[:4])} of "
                      f"{self.task.name}/{self.split})") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenStoreData(StoreStream):
  """Packed LM examples of one task's token store.

  Attributes (beyond StoreStream's):
    sequence_length: Tokens per example.
    global_batch_size: Examples per step over all processes.
    per_device_batch_size: Alternatively, examples per device (global = this x devices).
    num_batches: Batches in one eval pass; None for an endless stream.
  """

  sequence_length: Annotated[int, Int32Size]
  global_batch_size: PositiveInt | None = None
  per_device_batch_size: PositiveInt | None = None
  num_batches: PositiveInt | None = None

  def __post_init__(self):
    super().__post_init__()
    object.__setattr__(self, "global_batch_size", resolve_global_batch_size(
        self.global_batch_size, self.per_device_batch_size))

  def check(self) -> None:
    """Builds (or checks) the store before a program writes anything; an eval pass
    (`num_batches`) must not be longer than the split, which would count examples twice;
    the task's metric functions must be ones seqio can call."""
    metric_functions(self.task)
    examples = self.num_examples(self.sequence_length)
    if self.num_batches and self.num_batches * self.global_batch_size > examples:
      raise config_error("num_batches", self.num_batches, f"x global_batch_size "
                         f"{self.global_batch_size} is more than the split's {examples:,} "
                         f"examples of {self.sequence_length} tokens (some would count twice)",
                         f"use num_batches <= {max(examples // self.global_batch_size, 1)}")

  def batch_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
    return packed_batch_spec(self.global_batch_size, self.sequence_length)

  def examples_per_pass(self) -> int:
    """Examples in one pass over the split (an eval set with num_batches=None reads all)."""
    return self.num_examples(self.sequence_length)

  @property
  def token_bytes(self) -> np.ndarray | None:
    """UTF-8 bytes of text each token id stands for (eval's bits per byte)."""
    return _token_bytes(self.task)

  def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> Batch:
    rows = local_rows(self.global_batch_size, process_index, process_count)
    return self.windows(step * self.global_batch_size + rows, self.sequence_length)

  # Per-document scores (lingvo_lite.on_mesh.evaluation runs a task's seqio score metrics with
  # them).

  @property
  def metric_fns(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(score metric functions, prediction metric functions) of the task."""
    return metric_functions(self.task)

  def batch_examples(self, step: int) -> np.ndarray:
    """The example (window) of every global row of batch `step`, all processes'."""
    return self.examples_at(step * self.global_batch_size + np.arange(self.global_batch_size),
                            self.sequence_length)

  def document_starts(self) -> np.ndarray:
    return self.store().document_starts()

  def document_targets(self) -> list[Any]:
    """Each document's text, decoded and put through the task's postprocessor, as seqio
    hands a metric function its `targets`."""
    store, starts = self.store(), self.document_starts()
    window = 1 << 16
    tokens, weights, _, lengths = store.read(np.arange(0, store.num_tokens, window), window)
    del weights
    stream = np.concatenate([row[:length] for row, length in zip(tokens, lengths)] or [[]])
    vocab = self.task.output_features["targets"].vocabulary
    postprocess = getattr(self.task, "postprocess_fn", None)
    targets = []
    for ids in np.split(stream, starts[1:]):
      text = vocab.decode(ids.tolist())
      targets.append(postprocess(text, example=None, is_target=True) if postprocess else text)
    return targets


def metric_functions(task: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
  """(score, prediction) metric functions a seqio task defines; seqio's complaint about a
  function of another signature as one line naming the task. A task that gives its facts
  has none (task_facts.TaskFacts)."""
  if task_facts.facts_of(task) is not None:
    return (), ()
  try:
    return (tuple(getattr(task, "score_metric_fns", None) or ()),
            tuple(getattr(task, "predict_metric_fns", None) or ()))
  except ValueError as e:
    raise config_error("task", task.name, f"has a metric function seqio cannot call ({e})",
                       "give functions of (targets, scores) or (targets, predictions)") from None


@functools.lru_cache(maxsize=8)
def _vocabulary_fingerprint(task: Any) -> str | None:
  facts = task_facts.facts_of(task)
  if facts is not None:
    return facts.vocabulary.fingerprint
  try:
    return vocabulary.fingerprint(task.output_features["targets"].vocabulary)
  except TypeError:  # A vocabulary of another kind: not compared.
    return None


@functools.lru_cache(maxsize=8)  # Asked at every eval; a 50k-piece table takes a while.
def _token_bytes(task: Any) -> np.ndarray | None:
  """The text bytes of each id; None for ids with no text (pre-tokenized data): eval then
  reports bits per token only."""
  facts = task_facts.facts_of(task)
  if facts is not None:
    return facts.vocabulary.token_byte_lengths()
  try:
    return vocabulary.token_byte_lengths(task.output_features["targets"].vocabulary)
  except TypeError:
    return None


@dataclasses.dataclass(frozen=True)
class TokenStoreMixture:
  """Packed examples drawn from several token stores at fixed rates.

  Rows come in blocks of MIXTURE_BLOCK; each block holds each source's share of rows exactly
  (largest remainder), at slots given by a keyed permutation of the block, seeded by
  (seed, block). Which source global row g reads, and which of that source's positions, is
  therefore a pure function of g: a mixture resumes exactly and splits over processes as a
  single source does. Each source walks its own stream (its own epochs and shuffle).

  Attributes:
    sources: The StoreStreams to mix (one vocabulary).
    rates: Their relative rates (positive; normalized).
    sequence_length, global_batch_size, per_device_batch_size, num_batches: as
      TokenStoreData's.
    seed: Root of the slot permutations.
  """

  sources: Sequence[StoreStream]
  rates: Sequence[float]
  sequence_length: Annotated[int, Int32Size] = 128
  global_batch_size: PositiveInt | None = None
  per_device_batch_size: PositiveInt | None = None
  num_batches: PositiveInt | None = None
  seed: NonNegativeInt = 0

  def __post_init__(self):
    object.__setattr__(self, "global_batch_size", resolve_global_batch_size(
        self.global_batch_size, self.per_device_batch_size))
    if not self.sources or len(self.sources) != len(self.rates):
      raise config_error("rates", list(self.rates), f"needs one rate per source "
                         f"({len(self.sources)} sources)")
    for i, rate in enumerate(self.rates):
      if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0 or (
          not math.isfinite(rate)):
        raise config_error(f"rates[{i}]", rate, "must be a positive number")
    if not math.isfinite(float(sum(self.rates))):
      raise config_error("rates", list(self.rates), "their sum is not finite",
                         "give relative rates such as [0.8, 0.2]")
    sizes = {s.vocab_size for s in self.sources}
    if len(sizes) > 1:
      raise config_error("sources", [s.task.name for s in self.sources],
                         f"their vocabularies differ in size ({sorted(map(str, sizes))}); a "
                         "mixture's sources share one vocabulary")
    object.__setattr__(self, "_shares", _shares(self.rates, MIXTURE_BLOCK))

  @property
  def vocab_size(self) -> int | None:
    return self.sources[0].vocab_size

  @property
  def token_bytes(self) -> np.ndarray | None:
    return _token_bytes(self.sources[0].task)

  @property
  def vocabulary_fingerprint(self) -> str | None:
    return self.sources[0].vocabulary_fingerprint

  @property
  def text_vocabulary(self) -> Any:
    return self.sources[0].text_vocabulary

  def check(self) -> None:
    """Builds (or checks) every source's store; their vocabularies must be one."""
    fingerprints = {}
    for source in self.sources:
      fingerprints.setdefault(source.store().manifest["vocabulary"]["fingerprint"],
                              source.task.name)
    if len(fingerprints) > 1:
      raise config_error("sources", list(fingerprints.values()), "tokenize with different "
                         "vocabularies (of one size); a mixture's sources share one vocabulary",
                         "give every task the same vocabulary")

  def batch_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
    return packed_batch_spec(self.global_batch_size, self.sequence_length)

  def assign(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source index, position in that source's stream) of each global position."""
    positions = np.asarray(positions, dtype=np.int64)
    blocks, slots = np.divmod(positions, MIXTURE_BLOCK)
    shares = self._shares  # pytype: disable=attribute-error
    bounds = np.concatenate([[0], np.cumsum(shares)])
    permuted = np.empty_like(slots)
    for block in np.unique(blocks):
      chosen = blocks == block
      permuted[chosen] = KeyedPermutation(MIXTURE_BLOCK, self.seed, int(block))(slots[chosen])
    source = np.searchsorted(bounds, permuted, side="right") - 1
    return source, blocks * np.asarray(shares)[source] + permuted - bounds[source]

  def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> Batch:
    rows = local_rows(self.global_batch_size, process_index, process_count)
    source, position = self.assign(step * self.global_batch_size + rows)
    out: Batch = {}
    for index in np.unique(source):
      chosen = np.flatnonzero(source == index)
      part = self.sources[index].windows(position[chosen], self.sequence_length)
      for key, value in part.items():
        if key not in out:
          out[key] = np.zeros((len(rows),) + value.shape[1:], value.dtype)
        out[key][chosen] = value
    return out


def _shares(rates: Sequence[float], block: int) -> list[int]:
  """Rows of a block per source: `block` split by `rates` with the largest remainders."""
  total = float(sum(rates))
  exact = [block * r / total for r in rates]
  shares = [int(x) for x in exact]
  for i in sorted(range(len(rates)), key=lambda i: exact[i] - shares[i], reverse=True):
    if sum(shares) == block:
      break
    shares[i] += 1
  if min(shares) == 0:
    raise config_error("rates", list(rates), f"a rate below 1/{block} of the total gives its "
                       "source no rows", "raise it, or drop that source")
  return shares
