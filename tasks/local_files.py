"""Local files: seqio Tasks over the user's own text, JSON lines, Parquet or token files.

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
a line that is not JSON, a corrupt TFRecord) is a DataError naming the file and the record:
`line N` (1-based) in line files, `row N` (0-based) in Parquet, `record N` (0-based) in
TFRecords. Inside tf.data such an error reaches the caller wrapped in a TensorFlow error;
`data_error_from` (lingvo_lite.errors) recovers it. Records whose text is empty or only
whitespace are skipped: they hold no document.

seqio and TensorFlow are imported only when the task is made (first read).

Longer than 300 lines with a reason: the five factories are short and share what makes up the rest:
matching the files, checking the vocabulary, naming the task and reading a shard (`_text_task`,
`_match_files`, `_checked_vocabulary`, `_task_name`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import glob
import json
import os
import re
from typing import Callable, Iterator, Literal

from lingvo_lite.data import vocabulary as vocab_lib
from lingvo_lite.runtime.tensorflow_import import import_seqio, import_tensorflow
from lingvo_lite.errors import config_error, shown
# Re-exported: whoever reads a task's dataset recovers its readers' one-line errors with it.
from lingvo_lite.errors import data_error_from  # pylint: disable=unused-import
from tasks import local_readers as readers
from tasks.deferred import DeferredTask
from tasks.local_readers import Reader

_GLOB_CHARACTERS = re.compile(r"[*?[]")
_MAX_TOKEN_ID = 2**31 - 1  # Token ids are int32 in the store.



def text_files_task(files: dict[str, str | list[str]],
                    vocabulary: vocab_lib.SentencePieceModel | str | None = None,
                    unit: Literal["file", "line"] = "file") -> DeferredTask:
  """Plain UTF-8 text: each file one document, or each non-blank line one.

  Args:
    files: Split name -> glob pattern or list of patterns, e.g. `{"train": "data/*.txt"}`.
    vocabulary: None (bytes), a SentencePiece `.model` path, or a SentencePieceModel (trained
      on the "train" split's documents on first use).
    unit: "file" (a document is a file's whole text) or "line" (without its line break).

  Raises:
    UsageError: a bad argument, a pattern that matches no file, a split whose files are all
      empty, a missing vocabulary file.
  """
  if unit not in ("file", "line"):
    raise config_error("unit", unit, "is not a document unit", "give 'file' or 'line'")
  reader = readers.read_text_file if unit == "file" else readers.read_text_lines
  return _text_task(f"text_{unit}", files, vocabulary, {"unit": unit}, reader)


def json_lines_task(files: dict[str, str | list[str]],
                    vocabulary: vocab_lib.SentencePieceModel | str | None = None,
                    text_field: str = "text") -> DeferredTask:
  """JSON lines: each non-blank line an object whose `text_field` holds one document.

  Args:
    files: Split name -> glob pattern or list of patterns, e.g. `{"train": "data/*.jsonl"}`.
    vocabulary: As for `text_files_task`.
    text_field: The field of each record that holds the text.

  Raises:
    UsageError: as for `text_files_task`, and when a file's first record lacks `text_field`.
    DataError: a file's first record is not a JSON object.
  """
  _check_name("text_field", text_field)
  reader = lambda path: readers.read_json_text(path, text_field)
  check = lambda path: readers.check_json_fields(path, {"text_field": text_field})
  return _text_task("jsonl", files, vocabulary, {"text_field": text_field}, reader, check)


def prompt_completion_task(files: dict[str, str | list[str]],
                           vocabulary: vocab_lib.SentencePieceModel | str | None = None,
                           prompt_field: str = "prompt",
                           completion_field: str = "completion") -> DeferredTask:
  """Prompt/completion JSON lines for fine-tuning: the loss counts only the completion.

  A document is tokens(prompt) + tokens(completion) + EOS (the two tokenized apart), with
  `weights` 0 over the prompt and 1 over the completion and EOS. A vocabulary is trained on
  prompt + completion.

  Args:
    files: Split name -> glob pattern or list of patterns.
    vocabulary: As for `text_files_task`.
    prompt_field: The field holding the prompt (a string, maybe empty).
    completion_field: The field holding the completion (a string, maybe empty).

  Raises:
    UsageError, DataError: as for `json_lines_task`, for either field.
  """
  fields = {"prompt_field": prompt_field, "completion_field": completion_field}
  for path, name in fields.items():
    _check_name(path, name)
  reader = lambda path: readers.read_prompt_completion(path, prompt_field, completion_field)
  check = lambda path: readers.check_json_fields(path, fields)
  return _text_task("prompt_completion", files, vocabulary, fields, reader, check,
                    weighted=True)


def parquet_task(files: dict[str, str | list[str]],
                 vocabulary: vocab_lib.SentencePieceModel | str | None = None,
                 text_column: str = "text") -> DeferredTask:
  """Parquet files: each row's `text_column` (string or UTF-8 binary) one document; nulls skipped.

  Args:
    files: Split name -> glob pattern or list of patterns, e.g. `{"train": "data/*.parquet"}`.
    vocabulary: As for `text_files_task`.
    text_column: The column that holds the text.

  Raises:
    UsageError: as for `text_files_task`, and when a file lacks `text_column` or it holds no
      text.
    DataError: a file is not Parquet.
  """
  _check_name("text_column", text_column)
  reader = lambda path: readers.read_parquet(path, text_column)
  check = lambda path: readers.check_parquet_column(path, text_column)
  return _text_task("parquet", files, vocabulary, {"text_column": text_column}, reader, check,
                    is_empty=readers.parquet_is_empty)


def pretokenized_tfrecord_task(files: dict[str, str | list[str]], vocab_size: int,
                               feature: str = "text") -> DeferredTask:
  """TFRecords of tf.train.Example whose int64 `feature` holds one document's token ids.

  This is the format of mesh-transformer-jax's GPT-J fine-tuning data. Ids are kept as they
  are, with no EOS appended (such files already end each document with their own separator);
  the vocabulary is `seqio.PassThroughVocabulary(vocab_size)`.

  Args:
    files: Split name -> glob pattern or list of patterns, e.g. `{"train": "data/*.tfrecords"}`.
    vocab_size: Every id must be in [0, vocab_size).
    feature: The int64 feature holding the ids.

  Raises:
    UsageError: a bad argument, a pattern that matches no file, a split whose files are all
      empty; when the task is made: a file's first record lacks `feature`.
    DataError: when read, an id outside [0, vocab_size) or a corrupt record.
  """
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not (
      0 < vocab_size <= _MAX_TOKEN_ID):
    raise config_error("vocab_size", vocab_size, "is not a vocabulary size",
                       f"give the number of ids, an int in [1, {_MAX_TOKEN_ID}]")
  _check_name("feature", feature)
  matched = _match_files(files, _file_is_empty)
  name = _task_name("tokens", matched, {"vocab_size": vocab_size, "feature": feature})
  reader = lambda path: readers.read_token_records(path, feature, vocab_size)

  def make():
    tf, seqio = import_seqio()
    for path in _all_paths(matched):
      readers.check_token_feature(path, feature)
    vocabulary = seqio.PassThroughVocabulary(size=vocab_size)
    signature = {"targets": tf.TensorSpec([None], tf.int32)}
    return seqio.Task(
        name=name,
        source=_source(matched, reader, signature),
        preprocessors=[seqio.CacheDatasetPlaceholder()],
        output_features={"targets": seqio.Feature(vocabulary, add_eos=False, dtype=tf.int32)})

  return DeferredTask(name, tuple(matched), vocab_size, make)


# Building a task.


def _text_task(kind: str, files: dict, vocabulary, settings: dict, reader: Reader,
               check: Callable[[str], None] | None = None, is_empty=None,
               weighted: bool = False) -> DeferredTask:
  """The task over text read by `reader`, tokenized by `vocabulary`, each document + EOS."""
  matched = _match_files(files, is_empty or _file_is_empty)
  vocabulary = _checked_vocabulary(vocabulary, matched)
  for path in _all_paths(matched) if check else ():
    _read_at_construction(check, path)
  name = _task_name(kind, matched, {**settings, "vocabulary": _vocabulary_key(vocabulary)})
  size = vocab_lib.vocabulary_size(vocabulary)

  def train_texts() -> Iterator[bytes]:
    for path in matched["train"]:
      for example in readers.guarded(reader, path):
        yield example["text"]

  def make():
    tf, seqio = import_seqio()
    seqio_vocabulary = vocab_lib.resolve_vocabulary(vocabulary, name, train_texts)
    fields = ("prompt", "completion", "text") if weighted else ("text",)
    signature = {field: tf.TensorSpec([], tf.string) for field in fields}
    features = {"targets": seqio.Feature(seqio_vocabulary, add_eos=True, dtype=tf.int32)}
    if weighted:
      features["weights"] = seqio.Feature(seqio.PassThroughVocabulary(size=0), add_eos=False,
                                          dtype=tf.float32)
    return seqio.Task(
        name=name,
        source=_source(matched, reader, signature),
        preprocessors=[_tokenize_prompt_completion if weighted else _tokenize_text,
                       seqio.CacheDatasetPlaceholder()],
        output_features=features)

  return DeferredTask(name, tuple(matched), size, make)


def _source(matched: dict[str, list[str]], reader: Reader, signature: dict):
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


def _tokenize_text(dataset, output_features):
  tf = import_tensorflow()
  vocabulary = output_features["targets"].vocabulary
  eos = tf.constant([vocabulary.eos_id], tf.int32)

  def tokenize(example):
    tokens = tf.cast(vocabulary.encode_tf(example["text"]), tf.int32)
    return {"targets": tf.concat([tokens, eos], axis=0)}

  return dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)


def _tokenize_prompt_completion(dataset, output_features):
  tf = import_tensorflow()
  vocabulary = output_features["targets"].vocabulary
  eos = tf.constant([vocabulary.eos_id], tf.int32)

  def tokenize(example):
    prompt = tf.cast(vocabulary.encode_tf(example["prompt"]), tf.int32)
    completion = tf.cast(vocabulary.encode_tf(example["completion"]), tf.int32)
    weights = tf.concat([tf.zeros(tf.shape(prompt), tf.float32),
                         tf.ones(tf.shape(completion)[0] + 1, tf.float32)], axis=0)
    return {"targets": tf.concat([prompt, completion, eos], axis=0), "weights": weights}

  return dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)


# Checks at construction.


def _check_name(path: str, value: object) -> None:
  if not isinstance(value, str) or not value:
    raise config_error(path, value, "is not a field name", "give a non-empty string")


def _checked_vocabulary(vocabulary, matched: dict[str, list[str]]):
  """`vocabulary` with its path made absolute; UsageError when it cannot be used."""
  if vocabulary is None:
    return None
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
                     "give None (bytes), a SentencePiece .model path, or a SentencePieceModel")


def _match_files(files: dict, is_empty: Callable[[str], bool]) -> dict[str, list[str]]:
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
    if all(_read_at_construction(is_empty, p) for p in paths):
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


def _read_at_construction(check: Callable[[str], object], path: str) -> object:
  """`check(path)`, a file that cannot be read reported before any reading starts."""
  try:
    return check(path)
  except OSError as e:
    raise config_error("files", path, f"cannot be read ({e.strerror or e})",
                       "check the file's permissions") from None


def _all_paths(matched: dict[str, list[str]]) -> list[str]:
  return sorted({p for paths in matched.values() for p in paths})


def _file_is_empty(path: str) -> bool:
  return os.path.getsize(path) == 0


def _task_name(kind: str, matched: dict[str, list[str]], settings: dict) -> str:
  """`local_<kind>_<hash>`: the hash covers every matched path and every setting."""
  key = json.dumps({"kind": kind, "files": matched, "settings": settings}, sort_keys=True)
  return f"local_{kind}_{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def _vocabulary_key(vocabulary) -> object:
  if isinstance(vocabulary, vocab_lib.SentencePieceModel):
    return dataclasses.asdict(vocabulary)
  return vocabulary  # None (bytes) or an absolute path.
