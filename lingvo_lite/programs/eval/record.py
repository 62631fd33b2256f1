"""JOB/eval/evaluated.json: the record of which sets each step was evaluated on.

A set's row of a step is written before the record names it, so a restarted eval evaluates what
the record lacks, and first drops the rows the record does not name (a killed run's), leaving
one row per step. Process 0 keeps it.
"""

from __future__ import annotations

import json

from etils import epath

from lingvo_lite import input_files, paths
from lingvo_lite.errors import UsageError
from lingvo_lite.runtime import summaries
from lingvo_lite.on_mesh import evaluation

RECORD = "evaluated.json"


class EvalRecord:
  """The sets each step was evaluated on.

  Where there is no record (a first eval, or one moved away), it is rebuilt from the rows there
  are: a row is written only once its set's pass is complete, so a row is a result to keep.
  """

  def __init__(self, eval_dir: epath.Path, names: list[str]):
    self.eval_dir = eval_dir
    self._path = eval_dir / RECORD
    self.sets: dict[int, list[str]] = {}
    if not self._path.exists():
      for name in names:
        for step in summaries.logged_steps(evaluation.jsonl_path(eval_dir, name)):
          self.sets.setdefault(step, []).append(name)
      self.rebuilt = True
      return
    self.rebuilt = False
    try:
      data = input_files.json_value(self._path.read_text())
      self.sets = {int(step): list(names) for step, names in data["evaluated"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise UsageError(f"{self._path}: not an eval record written by lingvo_lite ({e}); move "
                       "it away, and the next eval rebuilds it from the rows there") from None

  def missing(self, step: int, names: list[str]) -> list[str]:
    return [name for name in names if name not in self.sets.get(step, [])]

  def has(self, step: int, name: str) -> bool:
    return name in self.sets.get(step, [])

  def forget(self, step: int, names: list[str]) -> None:
    """Before `names` are evaluated again at `step`: their rows are to be replaced."""
    kept = [name for name in self.sets.get(step, []) if name not in names]
    if kept:
      self.sets[step] = kept
    else:
      self.sets.pop(step, None)
    self._write()

  def add(self, step: int, names: list[str]) -> None:
    self.sets[step] = sorted(set(self.sets.get(step, [])) | set(names))
    self._write()

  def keep_recorded_rows(self, names: list[str]) -> None:
    """Drops the rows of `names` that the record does not name (a killed run's)."""
    for name in names:
      summaries.keep_rows(evaluation.jsonl_path(self.eval_dir, name),
                          evaluation.summaries_dir(self.eval_dir, name),
                          lambda step, name=name: self.has(step, name))

  def _write(self) -> None:
    text = json.dumps({"evaluated": {str(s): self.sets[s] for s in sorted(self.sets)}},
                      indent=1)
    paths.write_atomically(self._path, text + "\n")
