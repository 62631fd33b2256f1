"""Local files: what the tasks of every format of the user's own files share (tasks/formats/:
each format's task factory is in its module).

Each factory returns a `DeferredTask` whose source lists one shard per input file (absolute
paths, sorted) and reads a shard's documents in file order, so the token store builder can
read file k as shard k. After `preprocess_precache` and `preprocess_postcache` an example is
one whole document: `targets` (int32 token ids, EOS appended) and, for prompt/completion
files, `weights` (float32: 0 over the prompt, 1 over the completion and EOS). Nothing is cut
or packed here; the store packs documents itself.

The files are matched once, at construction (relative patterns against the current folder),
and the task's name carries a hash of the matched paths and the settings, so two tasks over
different files never share a name. Mistakes a user can fix before any reading (a pattern
that matches nothing, files that are all empty, a missing vocabulary file, a field the
first record lacks) are UsageErrors. Bad data met while reading (bytes that are not UTF-8,
a line that is not JSON, a corrupt TFRecord) is a DataError naming the file and the record
(tasks/local_readers.py); inside tf.data such an error reaches the caller wrapped in a
TensorFlow error, and `data_error_from` (lingvo_lite.errors) recovers it. Records whose text
is empty or only whitespace are skipped: they hold no document.

seqio and TensorFlow are imported only when the task is made (first read).
"""

from __future__ import annotations

import dataclasses
import hashlib
import glob
import json
import os
import re
from typing import Callable, Iterator

from lingvo_lite.data import vocabulary as vocab_lib
from lingvo_lite.runtime.tensorflow_import import import_seqio, import_tensorflow
from lingvo_lite.errors import config_error, shown
# Re-exported: whoever reads a task's dataset recovers its readers' one-line errors with it.
from lingvo_lite.errors import data_error_from  # pylint: disable=unused-import
from tasks import local_readers as readers
from tasks.deferred import DeferredTask
from tasks.local_readers import Reader

_GLOB_CHARACTERS = re.compile(r"[*?[]")
MAX_TOKEN_ID = 2**31 - 1  # Token ids are int32 in the store.


# Building a task.


def text_task(kind: str, files: dict, vocabulary, settings: dict, reader: Reader,
              check: Callable[[str], None] | None = None, is_empty=None,
              fields: tuple[str, ...] = ("text",), tokenize=None,
              weighted: bool = False) -> DeferredTask:
  """The task over text read by `reader`, tokenized by `vocabulary`, each document + EOS.

  Args:
    kind: The task name's kind (`local_<kind>_<hash>`).
    files, vocabulary: As the factories take them.
    settings: The format's settings (the name hashes them).
    reader: Reads a file's raw examples (strings `fields`; "text" is what a vocabulary is
      trained on).
    check: Run on every file at construction (its first record's fields, say).
    is_empty: Whether a file holds no document (default: zero bytes).
    fields: The string fields `reader` yields.
    tokenize: The preprocessor from raw examples to `targets` (default: `tokenize_text`).
    weighted: Examples also carry float32 `weights`.
  """
  matched = match_files(files, is_empty or file_is_empty)
  vocabulary = checked_vocabulary(vocabulary, matched)
  for path in all_paths(matched) if check else ():
    read_at_construction(check, path)
  name = task_name(kind, matched, {**settings, "vocabulary": _vocabulary_key(vocabulary)})
  size = vocab_lib.vocabulary_size(vocabulary)

  def train_texts() -> Iterator[bytes]:
    for path in matched["train"]:
      for example in readers.guarded(reader, path):
        yield example["text"]

  def make():
    tf, seqio = import_seqio()
    seqio_vocabulary = vocab_lib.resolve_vocabulary(vocabulary, name, train_texts)
    signature = {field: tf.TensorSpec([], tf.string) for field in fields}
    features = {"targets": seqio.Feature(seqio_vocabulary, add_eos=True, dtype=tf.int32)}
    if weighted:
      features["weights"] = seqio.Feature(seqio.PassThroughVocabulary(size=0), add_eos=False,
                                          dtype=tf.float32)
    return seqio.Task(
        name=name,
        source=file_source(matched, reader, signature),
        preprocessors=[tokenize or tokenize_text, seqio.CacheDatasetPlaceholder()],
        output_features=features)

  return DeferredTask(name, tuple(matched), size, make)


def file_source(matched: dict[str, list[str]], reader: Reader, signature: dict):
  """A seqio.FileDataSource with one shard per file, read by `reader` in file order."""
  tf, seqio = import_seqio()

  class LocalFileSource(seqio.FileDataSource):
    """The files matched at construction: a file named `a[1].txt` is not globbed again."""

    def list_shards(self, split: str) -> list[str]:
      return list(matched[split])

  def read_file(path):
    return tf.data.Dataset.from_generator(
        lambda path: readers.in_pipeline(reader, os.fsdecode(path)), args=(path,),
        output_signature=signature)

  # One file at a time (cycle_length=1): a whole split reads in file order too.
  return LocalFileSource(read_file, dict(matched), cycle_length=1, block_length=1)


def tokenize_text(dataset, output_features):
  tf = import_tensorflow()
  vocabulary = output_features["targets"].vocabulary
  eos = tf.constant([vocabulary.eos_id], tf.int32)

  def tokenize(example):
    tokens = tf.cast(vocabulary.encode_tf(example["text"]), tf.int32)
    return {"targets": tf.concat([tokens, eos], axis=0)}

  return dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)


# Checks at construction.


def check_name(path: str, value: object) -> None:
  if not isinstance(value, str) or not value:
    raise config_error(path, value, "is not a field name", "give a non-empty string")


def checked_vocabulary(vocabulary, matched: dict[str, list[str]]):
  """`vocabulary` with its path made absolute; UsageError when it cannot be used."""
  if vocabulary is None:
    return None
  if isinstance(vocabulary, vocab_lib.PretrainedTokenizer):
    vocab_lib.pretrained_tokenizer.read(vocabulary)  # One line naming vocabulary.path if bad.
    return dataclasses.replace(vocabulary, path=os.path.abspath(
        os.path.expanduser(vocabulary.path)))
  if isinstance(vocabulary, str):
    if not os.path.isfile(vocabulary):
      raise config_error("vocabulary", vocabulary, "no such file",
                         "give a SentencePiece .model file, a SentencePieceModel to train "
                         "one, or None for bytes")
    return os.path.abspath(vocabulary)
  if isinstance(vocabulary, vocab_lib.SentencePieceModel):
    if "train" not in matched:
      raise config_error("vocabulary", vocabulary, "is trained on the 'train' split, which "
                         f"files lacks (it has {shown(list(matched))})",
                         "add files['train'], or give a trained .model file")
    if vocabulary.path is not None:
      return dataclasses.replace(vocabulary, path=os.path.abspath(vocabulary.path))
    return vocabulary
  raise config_error("vocabulary", vocabulary, "is not a vocabulary",
                     "give None (bytes), a SentencePiece .model path, a SentencePieceModel or "
                     "a PretrainedTokenizer")


def match_files(files: dict, is_empty: Callable[[str], bool]) -> dict[str, list[str]]:
  """Split -> the sorted absolute paths its patterns match; UsageError naming a bad pattern."""
  if not isinstance(files, dict) or not files:
    raise config_error("files", files, "is not a mapping of split names to file patterns",
                       "give e.g. files={'train': 'data/*.txt'}")
  matched = {}
  for split, patterns in files.items():
    path = f"files[{split!r}]"
    if not isinstance(split, str) or not split:
      raise config_error("files", files, f"has a split name {shown(split)}, not a string",
                         "name splits like 'train'")
    listed = [patterns] if isinstance(patterns, str) else patterns
    if not isinstance(listed, (list, tuple)) or not listed or not all(
        isinstance(p, str) and p for p in listed):
      raise config_error(path, patterns, "is not a glob pattern or a list of them",
                         "give e.g. 'data/*.txt' or ['a.txt', 'b.txt']")
    found = set()
    for i, pattern in enumerate(listed):
      where = path if isinstance(patterns, str) else f"{path}[{i}]"
      found.update(_match_pattern(where, pattern))
    paths = sorted(found)
    if all(read_at_construction(is_empty, p) for p in paths):
      raise config_error(path, patterns, f"every matched file is empty ({len(paths)} files)",
                         "give files that hold documents")
    matched[split] = paths
  return matched


def _match_pattern(where: str, pattern: str) -> list[str]:
  """The regular files `pattern` names, each with a UTF-8 name (a FIFO would block the read,
  and TensorFlow's readers take only UTF-8 names)."""
  absolute = os.path.abspath(os.path.expanduser(pattern))
  if _GLOB_CHARACTERS.search(absolute):
    found = glob.glob(absolute, recursive=True)
    paths = [p for p in found if os.path.isfile(p)]
    if not paths and found:
      paths_found = f"{len(found)} path" + "s" * (len(found) != 1)
      raise config_error(where, pattern, f"matches {paths_found} but no regular file (folders, "
                         "FIFOs and devices are not read)",
                         "give a pattern of the files themselves")
    if not paths:
      raise config_error(where, pattern, "matches no file",
                         f"check the pattern (relative ones start at {os.getcwd()})")
  elif os.path.isdir(absolute):
    raise config_error(where, pattern, "is a folder, not a file",
                       f"give a pattern of its files, e.g. {os.path.join(pattern, '*')!r}")
  elif os.path.exists(absolute) and not os.path.isfile(absolute):
    raise config_error(where, pattern, "is not a regular file (a FIFO, a device or a socket), "
                       "which is not read", "give a file")
  elif not os.path.isfile(absolute):
    raise config_error(where, pattern, "no such file",
                       f"check the path (relative ones start at {os.getcwd()})")
  else:
    paths = [absolute]
  for path in paths:
    try:
      path.encode("utf-8")
    except UnicodeEncodeError:
      shown_path = os.fsencode(path).decode("utf-8", "backslashreplace")
      raise config_error(where, pattern, f"matches {shown_path}, whose name is not valid "
                         "UTF-8, which TensorFlow's file readers need", "rename it") from None
  return paths


def read_at_construction(check: Callable[[str], object], path: str) -> object:
  """`check(path)`, a file that cannot be read reported before any reading starts."""
  try:
    return check(path)
  except OSError as e:
    raise config_error("files", path, f"cannot be read ({e.strerror or e})",
                       "check the file's permissions") from None


def all_paths(matched: dict[str, list[str]]) -> list[str]:
  return sorted({p for paths in matched.values() for p in paths})


def file_is_empty(path: str) -> bool:
  return os.path.getsize(path) == 0


def task_name(kind: str, matched: dict[str, list[str]], settings: dict) -> str:
  """`local_<kind>_<hash>`: the hash covers every matched path and every setting."""
  key = json.dumps({"kind": kind, "files": matched, "settings": settings}, sort_keys=True)
  return f"local_{kind}_{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def _vocabulary_key(vocabulary) -> object:
  if isinstance(vocabulary, vocab_lib.SentencePieceModel):
    return dataclasses.asdict(vocabulary)
  if isinstance(vocabulary, vocab_lib.PretrainedTokenizer):  # By content, not by path.
    return vocab_lib.pretrained_tokenizer.read(vocabulary).fingerprint()
  return vocabulary  # None (bytes) or an absolute path.
