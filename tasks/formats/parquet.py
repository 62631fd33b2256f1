"""Parquet files: one column of each row (string or UTF-8 binary) holds a document; nulls are
skipped. A row of the formats' table (tasks/formats/__init__.py)."""

from __future__ import annotations

from typing import Iterator

from lingvo_lite.data import vocabulary as vocab_lib
from lingvo_lite.errors import DataError, config_error, shown
from tasks import local_files
from tasks.deferred import DeferredTask
from tasks.formats.row import Format, Setting
from tasks.local_readers import one_line, utf8


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



def _import_pyarrow():
  import pyarrow  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet  # pylint: disable=g-import-not-at-top,unused-import
  return pyarrow



def _parquet_file(path: str):
  pa = _import_pyarrow()
  try:
    return pa.parquet.ParquetFile(path)
  except (pa.ArrowException, ValueError) as e:
    raise DataError(f"{path}: not a readable Parquet file ({one_line(e)})") from None



def read_parquet(path: str, column: str) -> Iterator[dict]:
  pa = _import_pyarrow()
  row = 0
  batches = _parquet_file(path).iter_batches(batch_size=1024, columns=[column])
  while True:
    try:
      batch = next(batches, None)
    except (pa.ArrowException, ValueError) as e:
      raise DataError(f"{path}: row {row}: unreadable Parquet ({one_line(e)})") from None
    if batch is None:
      return
    # As binary, so that bytes that are not UTF-8 are found here, with their row.
    for value in batch.column(0).cast(pa.large_binary()).to_pylist():
      if value is not None and value.strip():
        utf8(value, path, f"row {row}")
        yield {"text": value}
      row += 1



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
  local_files.check_name("text_column", text_column)
  reader = lambda path: read_parquet(path, text_column)
  check = lambda path: check_parquet_column(path, text_column)
  return local_files.text_task("parquet", files, vocabulary, {"text_column": text_column},
                               reader, check, is_empty=parquet_is_empty)


FORMAT = Format(
    lambda files, vocabulary, settings: parquet_task(
        files, vocabulary, text_column=settings["text_column"]),
    (Setting("text_column", "text", help="the Parquet column holding the text (default: text)"),))
