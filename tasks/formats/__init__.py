"""The formats of local files a token store can be built from: `FORMATS`, name -> its row.

`bin/build_store.py --format=NAME` looks NAME up here: its `--format` choices, the flags it
defines for the formats' settings, and the task it builds all come from this table. A format is
one module of this package (its reader, its task factory and its `Format` row: tasks/formats/
row.py) and one entry below; the tool needs no edit. What the formats share is
tasks/local_files.py (matching files, the vocabulary, naming and reading a task) and
tasks/local_readers.py (records, errors).

A format's settings are command-line flags of the tool (`--text_field=body`). Two formats may
share a setting (the same name, default and help), which is then one flag. What every format
takes (`--files`, `--vocabulary`) is the tool's own.
"""

from __future__ import annotations

from tasks.formats import chat, jsonl, parquet, preference, prompt_completion, text, tfrecord
from tasks.formats.row import Files, Format, Setting

__all__ = ["FORMATS", "Files", "Format", "Setting", "all_settings"]

FORMATS: dict[str, Format] = {
    "text": text.TEXT,                            # Plain UTF-8 text: each file one document.
    "lines": text.LINES,                          # Each non-blank line one document.
    "jsonl": jsonl.FORMAT,                        # JSON lines: one field holds a document.
    "prompt_completion": prompt_completion.FORMAT,  # Fine-tuning on the completion only.
    "parquet": parquet.FORMAT,                    # One column of each row holds a document.
    "tfrecord": tfrecord.FORMAT,                  # Token ids (mesh-transformer-jax's format).
    "chat": chat.FORMAT,                          # Conversations: the assistant's tokens only.
    "preference": preference.FORMAT,              # Chosen/rejected pairs, for DPO.
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
