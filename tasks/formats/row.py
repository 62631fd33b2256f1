"""One row of the formats' table (tasks/formats/__init__.py): how a format's task is made, and
the settings it takes as flags of bin/build_store.py."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from tasks.deferred import DeferredTask

# Split -> a glob pattern or a list of them, as the formats' task factories take them.
Files = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Setting:
  """One setting of a format, given as the flag `--NAME`.

  Attributes:
    name: The flag's name, and the key under which the reader receives the value.
    default: The value when the flag is left out; None when the format needs it given.
    type: What the flag's text is parsed as (argparse's `type`).
    help: What the flag means, for `--help`.
    flag: A switch: given alone (`--NAME`), it is True; left out, `default`.
  """

  name: str
  default: Any = None
  type: Callable[[str], Any] = str
  help: str | None = None
  flag: bool = False


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
