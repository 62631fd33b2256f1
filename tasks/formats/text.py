"""Plain UTF-8 text files: each file one document (`text`), or each non-blank line one
(`lines`): two rows of the formats' table (tasks/formats/__init__.py)."""

from __future__ import annotations

from typing import Iterator, Literal

from lingvo_lite.data import vocabulary as vocab_lib
from lingvo_lite.errors import DataError, config_error
from tasks import local_files
from tasks.deferred import DeferredTask
from tasks.formats.row import Format
from tasks.local_readers import nonblank_lines, utf8


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



def read_text_lines(path: str) -> Iterator[dict]:
  for number, line in nonblank_lines(path):
    utf8(line, path, f"line {number}")
    yield {"text": line}



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
  reader = read_text_file if unit == "file" else read_text_lines
  return local_files.text_task(f"text_{unit}", files, vocabulary, {"unit": unit}, reader)


# Each file one document.
TEXT = Format(lambda files, vocabulary, _: text_files_task(files, vocabulary, unit="file"))
# Each non-blank line one document.
LINES = Format(lambda files, vocabulary, _: text_files_task(files, vocabulary, unit="line"))
