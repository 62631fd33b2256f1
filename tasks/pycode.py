"""PyCode: the Python standard library's own source files as a byte-level language-model corpus.

Every machine that runs Python has this corpus, so the default experiment trains on real
text with nothing to download. The split is by file and fixed: a file belongs to
`validation` when the CRC32 of its path relative to the library root is 0 mod 10, else to
`train`. Test suites (`test/`, `tests/`, `idle_test/`) and `site-packages/` are left out: they
are large, repetitive, and not part of the library proper.

Documents are tokenized as raw bytes (seqio's ByteVocabulary: id = byte + 3, with 0 pad,
1 EOS, 2 UNK), joined with EOS and cut into fixed-length examples, as GPT-J's pipeline does.
seqio and TensorFlow are imported only when the task's data is first read.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import zlib

from lingvo_lite.data.tensorflow_import import import_tensorflow
from lingvo_lite.errors import UsageError, config_error

# ByteVocabulary: 256 byte values + pad, EOS, UNK.
BYTE_VOCAB_SIZE = 259
EXCLUDED_DIRECTORIES = frozenset({"site-packages", "test", "tests", "idle_test", "__pycache__"})
SPLITS = ("train", "validation")


def stdlib_dir() -> str:
  """The running interpreter's standard-library folder."""
  return sysconfig.get_paths()["stdlib"]


def split_of(relative_path: str) -> str:
  """The split a file belongs to, from a hash of its path (stable across machines)."""
  return "validation" if zlib.crc32(relative_path.encode()) % 10 == 0 else "train"


def source_files(root: str, split: str) -> list[str]:
  """Sorted paths, relative to `root`, of the `.py` files in `split`."""
  found = []
  for directory, subdirectories, files in os.walk(root):
    subdirectories[:] = sorted(d for d in subdirectories if d not in EXCLUDED_DIRECTORIES)
    for name in files:
      if name.endswith(".py"):
        relative = os.path.relpath(os.path.join(directory, name), root)
        if split_of(relative) == split:
          found.append(relative)
  return sorted(found)


def _has_source_files(root: str) -> bool:
  """Whether any `.py` file is under `root` (outside the excluded folders); stops at the first."""
  for directory, subdirectories, files in os.walk(root):
    subdirectories[:] = [d for d in subdirectories if d not in EXCLUDED_DIRECTORIES]
    if any(name.endswith(".py") for name in files):
      return True
  return False


def read_documents(root: str, split: str) -> list[bytes]:
  """The raw bytes of every file in `split`, in `source_files` order."""
  documents = []
  for relative in source_files(root, split):
    with open(os.path.join(root, relative), "rb") as f:
      documents.append(f.read())
  return documents


def concat_and_chunk(dataset, sequence_length):
  """Joins the token streams of consecutive documents and cuts fixed-length examples.

  The remainder shorter than one example at the very end is dropped. Implemented with
  `Dataset.scan` carrying the unfinished tail, so nothing is materialized per token.
  """
  tf = import_tensorflow()
  length = sequence_length["targets"]

  def step(tail, example):
    stream = tf.concat([tail, example["targets"]], axis=0)
    whole = tf.shape(stream)[0] // length * length
    return stream[whole:], tf.reshape(stream[:whole], [-1, length])

  initial_tail = tf.zeros([0], dtype=dataset.element_spec["targets"].dtype)
  chunks = dataset.scan(initial_tail, step).unbatch()
  return chunks.map(lambda tokens: {"targets": tokens}, num_parallel_calls=tf.data.AUTOTUNE)


class DeferredTask:
  """A seqio Task made on first use: what a config needs to validate (its name, splits and
  vocabulary size) without TensorFlow, whose import alone takes 2.5 s, so `--mode=print`
  and `--mode=compile` of the PyCode experiments never load it. `get_dataset` and
  `output_features` make the Task (and raise the UsageError of a missing seqio)."""

  def __init__(self, name: str, splits: tuple[str, ...], vocab_size: int, make):
    self.name, self.splits, self.vocab_size, self._make = name, splits, vocab_size, make
    self._task = None

  @property
  def task(self):
    if self._task is None:
      self._task = self._make()
    return self._task

  @property
  def output_features(self):
    return self.task.output_features

  def get_dataset(self, *args, **kwargs):
    return self.task.get_dataset(*args, **kwargs)

  def __repr__(self) -> str:
    return f"DeferredTask({self.name!r})"


def pycode_task(source_dir: str | None = None) -> DeferredTask:
  """The seqio Task over the `.py` files under `source_dir` (default: this Python's stdlib),
  made when its data is first read.

  Raises:
    UsageError: when `source_dir` is not a folder or holds no `.py` file; when the data is
      read: seqio and TensorFlow are missing, or a split has no `.py` file.
  """
  root = source_dir or stdlib_dir()
  if not os.path.isdir(root):
    raise config_error("source_dir", root, "no such folder",
                       "give a folder of .py files, or None for this Python's stdlib")
  # No documents at all would fail deep inside TensorFlow once training reads them (an empty
  # list has no string type). A folder with files in one split only is refused when that
  # split is read (below): a small folder may well have no 'validation' file, and need none.
  if not _has_source_files(root):
    raise config_error("source_dir", root, "has no .py files (outside "
                       f"{', '.join(sorted(EXCLUDED_DIRECTORIES))})",
                       "give a folder of .py files, or None for this Python's stdlib")
  # The name carries the root so tasks over different folders never share a cache entry.
  digest = hashlib.sha1(os.path.abspath(root).encode()).hexdigest()[:8]
  name = f"pycode_bytes_{digest}"
  return DeferredTask(name, SPLITS, BYTE_VOCAB_SIZE, lambda: _make_task(root, name))


def _make_task(root: str, name: str):
  try:
    tf = import_tensorflow()
    import seqio  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    # A machine with only the JAX stack (no TensorFlow) can still train on synthetic data.
    raise UsageError(f"needs seqio and TensorFlow, which this Python lacks ({e}); install "
                     "them, or train on --fiddler=synthetic_data") from None

  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None):
    del shuffle_files, seed  # Order is fixed; lingvo_lite shuffles by index.
    documents = read_documents(root, split)
    if not documents:
      raise config_error("source_dir", root, f"has no .py file in the {split!r} split (a "
                         "file's split is fixed by a hash of its path; about 1 in 10 files is "
                         "'validation')", "give a folder with more .py files")
    return tf.data.Dataset.from_tensor_slices({"text": documents})

  return seqio.Task(
      name=name,
      source=seqio.FunctionDataSource(dataset_fn, splits=SPLITS),
      preprocessors=[
          _rekey_text_to_targets,
          seqio.preprocessors.tokenize,
          seqio.preprocessors.append_eos,
          concat_and_chunk,
      ],
      output_features={
          "targets": seqio.Feature(seqio.ByteVocabulary(), add_eos=True, dtype=tf.int32)},
  )


def _rekey_text_to_targets(dataset):
  return dataset.map(lambda example: {"targets": example["text"]})
