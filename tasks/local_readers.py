"""What every format's reader shares (tasks/formats/: each format's reader is in its module).

A reader is a path -> its raw examples, in file order: a Python generator (tf.data runs it
through `Dataset.from_generator`), so bad data is reported exactly: a DataError naming the file
and the record (`line N`, 1-based, in line files; `row N`, 0-based, in Parquet; `record N`,
0-based, in TFRecords). Inside tf.data its message follows `errors.DATA_ERROR_MARKER`, from
which `errors.data_error_from` recovers it. Here: a file that cannot be read as a DataError,
UTF-8 and JSON-lines records with the line they are on, and a library error in one line.
"""

from __future__ import annotations

import json
import re
from typing import Callable, Iterator

from lingvo_lite.errors import DATA_ERROR_MARKER, DataError, config_error, shown


Reader = Callable[[str], Iterator[dict]]  # a path -> its raw examples, in file order


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


def utf8(data: bytes, path: str, where: str) -> str:
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: {where}: not valid UTF-8 (byte 0x{data[e.start]:02x} at offset "
                    f"{e.start})") from None


def nonblank_lines(path: str) -> Iterator[tuple[int, bytes]]:
  """(1-based line number, line without its line break) for each non-blank line."""
  with open(path, "rb") as f:
    for number, line in enumerate(f, 1):
      line = line[:-1] if line.endswith(b"\n") else line
      line = line[:-1] if line.endswith(b"\r") else line
      if line.strip():
        yield number, line


def json_records(path: str) -> Iterator[tuple[int, dict]]:
  """(1-based line number, object) for each non-blank line."""
  for number, record in json_records_or_errors(path):
    if isinstance(record, DataError):
      raise record
    yield number, record


def json_records_or_errors(path: str) -> Iterator[tuple[int, dict | DataError]]:
  """(1-based line number, object or the DataError naming why the line is none) for each
  non-blank line: a reader that skips bad records (`--skip_bad_records`) goes on past one."""
  for number, line in nonblank_lines(path):
    try:
      record = json.loads(utf8(line, path, f"line {number}"))
    except json.JSONDecodeError as e:
      yield number, DataError(f"{path}: line {number}: not valid JSON ({e.msg} at column "
                              f"{e.colno})")
      continue
    except DataError as e:
      yield number, e
      continue
    if not isinstance(record, dict):
      yield number, DataError(f"{path}: line {number}: not a JSON object but a "
                              f"{type(record).__name__}")
      continue
    yield number, record


def text_field(record: dict, field: str, path: str, number: int) -> bytes:
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


def check_json_fields(path: str, fields: dict[str, str]) -> None:
  """UsageError when the file's first record lacks one of `fields` (config path -> name)."""
  for _, record in json_records(path):
    for config_path, field in fields.items():
      if field not in record:
        raise config_error(config_path, field, f"{path}: the first record has no such field "
                           f"(its fields: {shown(sorted(record))})",
                           f"set {config_path} to the field that holds the text")
    return


def one_line(error: BaseException) -> str:
  """An exception's message without TensorFlow's node names, op suffix or line breaks."""
  text = getattr(error, "message", None) or str(error)
  text = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$", "", text)
  return " ".join(text.split())
