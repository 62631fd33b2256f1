"""JSON lines: one field of each object holds a document. A row of the formats' table
(tasks/formats/__init__.py)."""

from __future__ import annotations

from typing import Iterator

from lingvo_lite.data import vocabulary as vocab_lib
from tasks import local_files
from tasks.deferred import DeferredTask
from tasks.formats.row import Format, Setting
from tasks.local_readers import check_json_fields, json_records, text_field


def read_json_text(path: str, field: str) -> Iterator[dict]:
  for number, record in json_records(path):
    text = text_field(record, field, path, number)
    if text.strip():
      yield {"text": text}



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
  local_files.check_name("text_field", text_field)
  reader = lambda path: read_json_text(path, text_field)
  check = lambda path: check_json_fields(path, {"text_field": text_field})
  return local_files.text_task("jsonl", files, vocabulary, {"text_field": text_field}, reader,
                               check)


FORMAT = Format(
    lambda files, vocabulary, settings: json_lines_task(
        files, vocabulary, text_field=settings["text_field"]),
    (Setting("text_field", "text", help="the JSON field holding the text (default: text)"),))
