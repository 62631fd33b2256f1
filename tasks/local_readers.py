"""The per-format readers of tasks/local_files: a path -> its raw examples, in file order.

Each reader is a Python generator (tf.data runs it through `Dataset.from_generator`), so bad
data is reported exactly: a DataError naming the file and the record (`line N`, 1-based, in
line files; `row N`, 0-based, in Parquet; `record N`, 0-based, in TFRecords). Inside tf.data
its message follows `errors.DATA_ERROR_MARKER`, from which `errors.data_error_from` recovers it.
"""

from __future__ import annotations

import json
import os
import re
from typing import Callable, Iterator

import numpy as np

from lingvo_lite.runtime.tensorflow_import import import_tensorflow
from lingvo_lite.errors import DATA_ERROR_MARKER, DataError, config_error, shown


Reader = Callable[[str], Iterator[dict]]  # a path -> its raw examples, in file order


def check_token_feature(path: str, feature: str) -> None:
  """UsageError when the file's first record lacks the int64 `feature` (needs TensorFlow)."""
  for example in _token_examples(path):
    found = example.features.feature
    if feature not in found or found[feature].WhichOneof("kind") != "int64_list":
      raise config_error("feature", feature, f"{path}: the first record has no int64 feature "
                         f"of that name (its features: {shown(sorted(found))})",
                         "set feature to the one that holds the token ids")
    return


def parquet_is_empty(path: str) -> bool:
  return _parquet_file(path).metadata.num_rows == 0


def check_parquet_column(path: str, column: str) -> None:
  pa = _import_pyarrow()
  schema = _parquet_file(path).schema_arrow
  if column not in schema.names:
    raise config_error("text_column", column, f"{path}: no such column (its columns: "
                       f"{shown(schema.names)})", "set text_column to the column of the text")
  kind = schema.field(column).type
  if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or
          pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
    raise config_error("text_column", column, f"{path}: the column holds {kind}, not text",
                       "set text_column to a string column")


def check_json_fields(path: str, fields: dict[str, str]) -> None:
  """UsageError when the file's first record lacks one of `fields` (config path -> name)."""
  for _, record in _json_records(path):
    for config_path, field in fields.items():
      if field not in record:
        raise config_error(config_path, field, f"{path}: the first record has no such field "
                           f"(its fields: {shown(sorted(record))})",
                           f"set {config_path} to the field that holds the text")
    return


def guarded(reader: Reader, path: str) -> Iterator[dict]:
  """`reader(path)`, with a file that cannot be read reported as a DataError."""
  try:
    yield from reader(path)
  except OSError as e:
    raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None


def in_pipeline(reader: Reader, path: str) -> Iterator[dict]:
  """`guarded(reader, path)` for tf.data: a DataError's message follows the marker."""
  try:
    yield from guarded(reader, path)
  except DataError as e:
    raise DataError(DATA_ERROR_MARKER + str(e)) from None


def _utf8(data: bytes, path: str, where: str) -> str:
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: {where}: not valid UTF-8 (byte 0x{data[e.start]:02x} at offset "
                    f"{e.start})") from None


def read_text_file(path: str) -> Iterator[dict]:
  with open(path, "rb") as f:
    data = f.read()
  try:
    data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise DataError(f"{path}: line {line}: not valid UTF-8 (byte 0x{data[e.start]:02x} at "
                    f"offset {e.start} of the file)") from None
  if data.strip():
    yield {"text": data}


def _lines(path: str) -> Iterator[tuple[int, bytes]]:
  """(1-based line number, line without its line break) for each non-blank line."""
  with open(path, "rb") as f:
    for number, line in enumerate(f, 1):
      line = line[:-1] if line.endswith(b"\n") else line
      line = line[:-1] if line.endswith(b"\r") else line
      if line.strip():
        yield number, line


def read_text_lines(path: str) -> Iterator[dict]:
  for number, line in _lines(path):
    _utf8(line, path, f"line {number}")
    yield {"text": line}


def _json_records(path: str) -> Iterator[tuple[int, dict]]:
  """(1-based line number, object) for each non-blank line."""
  for number, line in _lines(path):
    try:
      record = json.loads(_utf8(line, path, f"line {number}"))
    except json.JSONDecodeError as e:
      raise DataError(f"{path}: line {number}: not valid JSON ({e.msg} at column {e.colno})"
                      ) from None
    if not isinstance(record, dict):
      raise DataError(f"{path}: line {number}: not a JSON object but a "
                      f"{type(record).__name__}")
    yield number, record


def _text_field(record: dict, field: str, path: str, number: int) -> bytes:
  where = f"{path}: line {number}"
  if field not in record:
    raise DataError(f"{where}: has no field {field!r} (its fields: {shown(sorted(record))})")
  value = record[field]
  if not isinstance(value, str):
    raise DataError(f"{where}: field {field!r} holds a {type(value).__name__}, not a string")
  try:
    return value.encode("utf-8")
  except UnicodeEncodeError as e:
    raise DataError(f"{where}: field {field!r} is not valid Unicode ({e.reason})") from None


def read_json_text(path: str, field: str) -> Iterator[dict]:
  for number, record in _json_records(path):
    text = _text_field(record, field, path, number)
    if text.strip():
      yield {"text": text}


def read_prompt_completion(path: str, prompt_field: str, completion_field: str):
  for number, record in _json_records(path):
    prompt = _text_field(record, prompt_field, path, number)
    completion = _text_field(record, completion_field, path, number)
    yield {"prompt": prompt, "completion": completion, "text": prompt + completion}


def _import_pyarrow():
  import pyarrow  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet  # pylint: disable=g-import-not-at-top,unused-import
  return pyarrow


def _parquet_file(path: str):
  pa = _import_pyarrow()
  try:
    return pa.parquet.ParquetFile(path)
  except (pa.ArrowException, ValueError) as e:
    raise DataError(f"{path}: not a readable Parquet file ({_one_line(e)})") from None


def read_parquet(path: str, column: str) -> Iterator[dict]:
  pa = _import_pyarrow()
  row = 0
  batches = _parquet_file(path).iter_batches(batch_size=1024, columns=[column])
  while True:
    try:
      batch = next(batches, None)
    except (pa.ArrowException, ValueError) as e:
      raise DataError(f"{path}: row {row}: unreadable Parquet ({_one_line(e)})") from None
    if batch is None:
      return
    # As binary, so that bytes that are not UTF-8 are found here, with their row.
    for value in batch.column(0).cast(pa.large_binary()).to_pylist():
      if value is not None and value.strip():
        _utf8(value, path, f"row {row}")
        yield {"text": value}
      row += 1


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
      raise DataError(f"{path}: record {index}: corrupt TFRecord ({_one_line(e)})") from None
    read += len(record.numpy()) + 16
    try:
      yield tf.train.Example.FromString(record.numpy())
    except DecodeError as e:
      raise DataError(f"{path}: record {index}: not a tf.train.Example ({_one_line(e)})"
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


def _one_line(error: BaseException) -> str:
  """An exception's message without TensorFlow's node names, op suffix or line breaks."""
  text = getattr(error, "message", None) or str(error)
  text = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$", "", text)
  return " ".join(text.split())
