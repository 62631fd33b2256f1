"""TFRecords of tf.train.Example holding token ids (mesh-transformer-jax's format): the ids are
the tokens, no vocabulary is trained or applied. A row of the formats' table
(tasks/formats/__init__.py)."""

from __future__ import annotations

import os
from typing import Any, Iterator, Mapping

import numpy as np

from lingvo_lite.errors import DataError, UsageError, config_error, shown
from lingvo_lite.runtime.tensorflow_import import import_seqio, import_tensorflow
from tasks import local_files
from tasks.deferred import DeferredTask
from tasks.formats.row import Files, Format, Setting
from tasks.local_readers import one_line


def check_token_feature(path: str, feature: str) -> None:
  """UsageError when the file's first record lacks the int64 `feature` (needs TensorFlow)."""
  for example in _token_examples(path):
    found = example.features.feature
    if feature not in found or found[feature].WhichOneof("kind") != "int64_list":
      raise config_error("feature", feature, f"{path}: the first record has no int64 feature "
                         f"of that name (its features: {shown(sorted(found))})",
                         "set feature to the one that holds the token ids")
    return



def _token_examples(path: str):
  """The file's tf.train.Examples; DataError naming the record that is corrupt."""
  tf = import_tensorflow()
  from google.protobuf.message import DecodeError  # pylint: disable=g-import-not-at-top
  records = iter(tf.data.TFRecordDataset(path))
  index = 0
  read = 0  # Bytes of the complete records so far: each is framed by 16 bytes.
  while True:
    try:
      record = next(records)
    except StopIteration:
      _check_no_tail(path, read, index)
      return
    except tf.errors.OpError as e:
      raise DataError(f"{path}: record {index}: corrupt TFRecord ({one_line(e)})") from None
    read += len(record.numpy()) + 16
    try:
      yield tf.train.Example.FromString(record.numpy())
    except DecodeError as e:
      raise DataError(f"{path}: record {index}: not a tf.train.Example ({one_line(e)})"
                      ) from None
    index += 1



def _check_no_tail(path: str, read: int, records: int) -> None:
  """TensorFlow ends a TFRecord file quietly at bytes too few for a record's 12-byte header (a
  file cut short, or no TFRecord at all): a file longer than its complete records is refused,
  not read as fewer (or no) documents."""
  try:
    size = os.path.getsize(path)
  except OSError:  # A remote path: TensorFlow read it; nothing more to check here.
    return
  if size > read:
    raise DataError(f"{path}: record {records}: truncated TFRecord ({size - read} bytes after "
                    f"the last complete record, too few for a record's header); rewrite the "
                    "file, or leave it out")



def read_token_records(path: str, feature: str, vocab_size: int) -> Iterator[dict]:
  for index, example in enumerate(_token_examples(path)):
    found = example.features.feature
    if feature not in found or found[feature].WhichOneof("kind") != "int64_list":
      raise DataError(f"{path}: record {index}: has no int64 feature {feature!r} (its "
                      f"features: {shown(sorted(found))})")
    ids = np.array(found[feature].int64_list.value, dtype=np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
      raise DataError(f"{path}: record {index}: token id {ids[bad[0]]} at position {bad[0]} is "
                      f"outside [0, {vocab_size}) (vocab_size={vocab_size})")
    if ids.size:
      yield {"targets": ids.astype(np.int32)}



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
      0 < vocab_size <= local_files.MAX_TOKEN_ID):
    raise config_error("vocab_size", vocab_size, "is not a vocabulary size",
                       f"give the number of ids, an int in [1, {local_files.MAX_TOKEN_ID}]")
  local_files.check_name("feature", feature)
  matched = local_files.match_files(files, local_files.file_is_empty)
  name = local_files.task_name("tokens", matched, {"vocab_size": vocab_size, "feature": feature})
  reader = lambda path: read_token_records(path, feature, vocab_size)

  def make():
    tf, seqio = import_seqio()
    for path in local_files.all_paths(matched):
      check_token_feature(path, feature)
    vocabulary = seqio.PassThroughVocabulary(size=vocab_size)
    signature = {"targets": tf.TensorSpec([None], tf.int32)}
    return seqio.Task(
        name=name,
        source=local_files.file_source(matched, reader, signature),
        preprocessors=[seqio.CacheDatasetPlaceholder()],
        output_features={"targets": seqio.Feature(vocabulary, add_eos=False, dtype=tf.int32)})

  return DeferredTask(name, tuple(matched), vocab_size, make)



def _pretokenized(files: Files, vocabulary: Any, settings: Mapping[str, Any]) -> DeferredTask:
  """The ids are the tokens: no vocabulary is trained or applied, so its size must be given."""
  del vocabulary  # Ids are kept as they are.
  if settings["vocab_size"] is None:
    raise UsageError("--vocab_size: required with --format=tfrecord (ids are kept as they are)")
  return pretokenized_tfrecord_task(files, settings["vocab_size"])


FORMAT = Format(_pretokenized,
                (Setting("vocab_size", type=int, help="ids of pre-tokenized TFRecords"),))
