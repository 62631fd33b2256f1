"""The formats of local files a token store can be built from: `FORMATS`, name -> its reader.

`bin/build_store.py --format=NAME` looks NAME up here: its `--format` choices, the flags it
defines for the formats' settings, and the task it builds all come from this table. Adding a
format is its reader (a record reader in tasks/local_readers.py and the task factory over it in
tasks/local_files.py) and one entry below; the tool needs no edit.

A format's settings are command-line flags of the tool (`--text_field=body`). Two formats may
share a setting (the same name, default and help), which is then one flag. What every format
takes (`--files`, `--vocabulary`) is the tool's own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from lingvo_lite.errors import UsageError
from tasks import local_files
from tasks.deferred import DeferredTask

# Split -> a glob pattern or a list of them, as the local_files factories take them.
Files = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Setting:
  """One setting of a format, given as the flag `--NAME`.

  Attributes:
    name: The flag's name, and the key under which the reader receives the value.
    default: The value when the flag is left out; None when the format needs it given.
    type: What the flag's text is parsed as (argparse's `type`).
    help: What the flag means, for `--help`.
  """

  name: str
  default: Any = None
  type: Callable[[str], Any] = str
  help: str | None = None


@dataclasses.dataclass(frozen=True)
class Format:
  """One format of local files: how its task is made, and the settings it takes.

  Attributes:
    read: (files, vocabulary, settings) -> the task over those files. `vocabulary` is None
      (bytes), a SentencePiece `.model` path or a SentencePieceModel; `settings` maps each of
      `settings`' names to its value (the default where the flag was left out).
    settings: The format's own settings, in the order `--help` lists them.
  """

  read: Callable[[Files, Any, Mapping[str, Any]], DeferredTask]
  settings: tuple[Setting, ...] = ()


def _pretokenized(files: Files, vocabulary: Any, settings: Mapping[str, Any]) -> DeferredTask:
  """The ids are the tokens: no vocabulary is trained or applied, so its size must be given."""
  del vocabulary  # Ids are kept as they are.
  if settings["vocab_size"] is None:
    raise UsageError("--vocab_size: required with --format=tfrecord (ids are kept as they are)")
  return local_files.pretokenized_tfrecord_task(files, settings["vocab_size"])


FORMATS: dict[str, Format] = {
    # Plain UTF-8 text: each file one document.
    "text": Format(lambda files, vocabulary, _: local_files.text_files_task(
        files, vocabulary, unit="file")),
    # Plain UTF-8 text: each non-blank line one document.
    "lines": Format(lambda files, vocabulary, _: local_files.text_files_task(
        files, vocabulary, unit="line")),
    # JSON lines: one field of each object holds a document.
    "jsonl": Format(
        lambda files, vocabulary, settings: local_files.json_lines_task(
            files, vocabulary, text_field=settings["text_field"]),
        (Setting("text_field", "text", help="the JSON field holding the text (default: text)"),)),
    # JSON lines of prompt and completion, for fine-tuning on the completion only.
    "prompt_completion": Format(
        lambda files, vocabulary, settings: local_files.prompt_completion_task(
            files, vocabulary, settings["prompt_field"], settings["completion_field"]),
        (Setting("prompt_field", "prompt",
                 help="the JSON field holding the prompt (default: prompt)"),
         Setting("completion_field", "completion",
                 help="the JSON field holding the completion (default: completion)"))),
    # Parquet: one column of each row holds a document.
    "parquet": Format(
        lambda files, vocabulary, settings: local_files.parquet_task(
            files, vocabulary, text_column=settings["text_column"]),
        (Setting("text_column", "text",
                 help="the Parquet column holding the text (default: text)"),)),
    # TFRecords of tf.train.Example holding token ids (mesh-transformer-jax's format).
    "tfrecord": Format(_pretokenized,
                       (Setting("vocab_size", type=int, help="ids of pre-tokenized TFRecords"),)),
}


def all_settings() -> list[Setting]:
  """Every format's settings, each name once, in table order: the flags a tool defines.

  Raises:
    ValueError: two formats declare one name differently (one flag cannot serve both).
  """
  found: dict[str, Setting] = {}
  for name, format_ in FORMATS.items():
    for setting in format_.settings:
      if found.setdefault(setting.name, setting) != setting:
        raise ValueError(f"FORMATS[{name!r}] declares the setting {setting.name!r} unlike an "
                         "earlier format; give both the same default, type and help, or "
                         "another name")
  return list(found.values())
