"""PyCode: the Python standard library's own source files as a byte-level language-model corpus.

Every machine that runs Python has this corpus, so the default experiment trains on real
text with nothing to download. The split is by file and fixed: a file belongs to
`validation` when the CRC32 of its path relative to the library root is 0 mod 10, else to
`train`. Test suites (`test/`, `tests/`, `idle_test/`) and `site-packages/` are left out: they
are large, repetitive, and not part of the library proper.

Each file is one document, tokenized as raw bytes (seqio's ByteVocabulary: id = byte + 3,
with 0 pad, 1 EOS, 2 UNK) or by a SentencePiece model trained on the train split, with EOS
appended; the token store (lingvo_lite/data/token_store.py) packs the documents into
examples. seqio and TensorFlow are imported only when the task's data is first read.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import zlib
from typing import Any, Callable, Sequence

from lingvo_lite import input_files
from lingvo_lite.data import vocabulary as vocabulary_lib
from lingvo_lite.data.store_build import describe_preprocessor
from lingvo_lite.data.task_facts import TaskFacts
from lingvo_lite.runtime.tensorflow_import import import_seqio
from lingvo_lite.errors import config_error
from tasks.deferred import DeferredTask

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
  """Sorted paths, relative to `root`, of the `.py` files in `split`.

  Raises:
    UsageError: one of them is a FIFO or a device (reading it would wait or run for ever).
  """
  found = []
  for directory, subdirectories, files in os.walk(root):
    subdirectories[:] = sorted(d for d in subdirectories if d not in EXCLUDED_DIRECTORIES)
    for name in files:
      if name.endswith(".py"):
        relative = os.path.relpath(os.path.join(directory, name), root)
        if split_of(relative) == split:
          kind = input_files.kind_of(os.path.join(root, relative))
          if kind is not None:
            raise config_error("source_dir", root, f"holds {relative}, which is {kind}, not a "
                               "regular file (reading it could wait or run for ever)",
                               "move it away")
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


def pycode_task(source_dir: str | None = None, vocabulary: Any = None,
                metric_fns: Sequence[Callable[..., Any]] = ()) -> DeferredTask:
  """The seqio Task over the `.py` files under `source_dir` (default: this Python's stdlib),
  one document per file, made when its data is first read.

  Args:
    source_dir: A folder of `.py` files; None for this Python's standard library.
    vocabulary: None for bytes; a SentencePiece `.model` path; a
      `vocabulary.SentencePieceModel`, trained from this task's train split on first use; or a
      `vocabulary.PretrainedTokenizer` (a pretrained model's own tokenizer).
    metric_fns: seqio metric functions: `(targets, scores)` ones run on every whole-split
      eval pass, with each file's text and log-likelihood (lingvo_lite.on_mesh.evaluation).

  Raises:
    UsageError: when `source_dir` is not a folder or holds no `.py` file, or `vocabulary`
      names no file; when the data is read: seqio and TensorFlow are missing, or a split has
      no `.py` file.
  """
  given = source_dir or stdlib_dir()  # As the user wrote it, for messages.
  if not os.path.isdir(given):
    raise config_error("source_dir", given, "no such folder",
                       "give a folder of .py files, or None for this Python's stdlib")
  # No documents at all would fail deep inside TensorFlow once training reads them. A folder
  # with files in one split only is refused when that split is read (below): a small folder
  # may well have no 'validation' file, and need none.
  if not _has_source_files(given):
    raise config_error("source_dir", given, "has no .py files (outside "
                       f"{', '.join(sorted(EXCLUDED_DIRECTORIES))})",
                       "give a folder of .py files, or None for this Python's stdlib")
  root = os.path.abspath(given)  # Resolved once, at the edge: the name and the files use it.
  vocab_size = vocabulary_lib.vocabulary_size(vocabulary)
  # The name carries the root and the vocabulary, so tasks over different folders or
  # vocabularies never share a store.
  # A model file is named by its absolute path; a model to train, by its settings.
  # A pretrained tokenizer, by its content (the same tokenizer read from another path shares
  # the store).
  if isinstance(vocabulary, (str, os.PathLike)):
    described = os.path.abspath(vocabulary)
  elif isinstance(vocabulary, vocabulary_lib.PretrainedTokenizer):
    described = vocabulary_lib.vocabulary_facts(vocabulary, "").fingerprint
  else:
    described = repr(vocabulary)
  digest = hashlib.sha1(f"{root}|{described}".encode()).hexdigest()[:8]
  kind = ("bytes" if vocabulary is None else
          f"tok{vocab_size}" if isinstance(vocabulary, vocabulary_lib.PretrainedTokenizer)
          else f"sp{vocab_size}")
  name = f"pycode_{kind}_{digest}"
  # Metrics are left out of the name: they change no token, so the tasks share a store.
  return DeferredTask(name, SPLITS, vocab_size,
                      lambda: _make_task(root, name, vocabulary, list(metric_fns)),
                      facts=lambda: _facts(root, name, vocabulary, list(metric_fns)))


def _facts(root: str, name: str, vocabulary: Any,
           metric_fns: list[Callable[..., Any]]) -> TaskFacts | None:
  """What `_make_task(root, name, vocabulary, metric_fns)` will say, without seqio (None where
  it cannot be known unmade: metric functions, an untrained SentencePieceModel)."""
  vocab = vocabulary_lib.vocabulary_facts(vocabulary, name)
  if vocab is None or metric_fns:
    return None
  return TaskFacts(vocabulary=vocab,
                   preprocessors=(describe_preprocessor(_rekey_text_to_targets),
                                  "seqio.preprocessors.tokenize", "seqio.preprocessors.append_eos"),
                   input_files=lambda split: _split_files(root, split))


def _split_files(root: str, split: str) -> list[str]:
  """The files of `split`, as the Task's source lists them (its input shards)."""
  files = [os.path.join(root, relative) for relative in source_files(root, split)]
  if not files:
    raise config_error("source_dir", root, f"has no .py file in the {split!r} split (a "
                       "file's split is fixed by a hash of its path; about 1 in 10 files "
                       "is 'validation')", "give a folder with more .py files")
  return files


def _make_task(root: str, name: str, vocabulary: Any, metric_fns: list[Callable[..., Any]]):
  tf, seqio = import_seqio()
  vocab = vocabulary_lib.resolve_vocabulary(
      vocabulary, name, lambda: read_documents(root, "train"))

  class WholeFiles(seqio.FileDataSource):
    """One document per file; one input shard per file, so store builds spread over them."""

    def __init__(self):
      super().__init__(
          read_file_fn=lambda path: tf.data.Dataset.from_tensors({"text": tf.io.read_file(path)}),
          split_to_filepattern={split: split for split in SPLITS})
      self._files: dict[str, list[str]] = {}

    def list_shards(self, split: str) -> list[str]:
      # Walked once per split: a store build asks for every group of files it reads.
      if split not in self._files:
        self._files[split] = _split_files(root, split)
      return self._files[split]

  return seqio.Task(
      name=name,
      source=WholeFiles(),
      preprocessors=[
          _rekey_text_to_targets,
          seqio.preprocessors.tokenize,
          seqio.preprocessors.append_eos,
      ],
      output_features={"targets": seqio.Feature(vocab, add_eos=True, dtype=tf.int32)},
      metric_fns=metric_fns,
  )


def _rekey_text_to_targets(dataset):
  return dataset.map(lambda example: {"targets": example["text"]})
