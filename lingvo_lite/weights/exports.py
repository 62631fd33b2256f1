"""What `--mode=export` asks of a weight format's writer (the formats' table, weights/formats.py,
names each format's): the request, the protocol a writer answers, and how sizes are shown.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol

from etils import epath


@dataclasses.dataclass(frozen=True)
class ExportRequest:
  """What `--mode=export` asks of a format's writer.

  Attributes:
    setup: The job's built Setup (its model, its data's vocabulary).
    dtype: What every tensor is written as (one of the writer's `dtypes`).
    export_dir: The folder as the user gave it (for messages).
    shard_bytes: The largest file, where the format splits its tensors into files.
    params: The job's parameters, opened (weights/job_params.py: their mesh and shapes, and,
      once loaded, where they came from).
    config_json: The job's config as config.json's text.
  """

  setup: Any
  dtype: str
  export_dir: str
  shard_bytes: int
  params: Any
  config_json: Callable[[], str]


class Export(Protocol):
  """A writer of one format for one job, made from an `ExportRequest` (which it checks: a
  model the format cannot express is refused before anything is read).

  Attributes:
    kind: Its manifest's kind (outputs.py): an earlier export of that kind is replaced.
    dtypes: What `--export_dtype` may be (a class attribute: checked before one is made).
    dtype_note: What `--export_dtype`'s help adds about them ("" for nothing).
    names: Every file the folder gets (the manifest aside), known before reading.
  """

  kind: str
  dtypes: tuple[str, ...]
  dtype_note: str
  names: tuple[str, ...]

  def take(self, params: Any) -> None:
    """Takes the loaded parameters (device arrays), keeping what it writes from them."""

  def write(self, folder: epath.Path) -> dict[str, Any]:
    """Writes the files into the empty `folder`; returns what the manifest records (with
    `files`: name -> bytes)."""

  def summary(self, written: dict[str, Any]) -> str:
    """What was written, after `exported ... : FORMAT, DTYPE, `."""

  def details(self, written: dict[str, Any]) -> list[str]:
    """Lines printed under the summary."""


def size_text(count: int) -> str:
  """A byte count as people read it (`1.2 GB`)."""
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
    if count >= scale:
      return f"{count / scale:.1f} {unit}"
  return f"{count} bytes"
