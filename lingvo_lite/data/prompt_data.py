"""Prompts for reinforcement learning: a set of prompt records (data/prompt_records.py) read
from JSON lines, as a stream a run draws from.

The set is every record of the files the patterns match, files in sorted order and each in
line order, read once and checked: a record that breaks the format is refused in one line
naming the file, the line and why (DataError), or, with `skip_bad_records`, left out and
counted (`check()` says how many, and the first one's reason, in one warning), as the chat and
preference formats treat theirs; an `id` is unique in the set. Records are not tokenized here:
the rollout renders them (`prompt_records.prompt_text`) and the rewards read them whole.

Stream position p (the p-th prompt the run draws) is record `permutation(seed, epoch)(p mod n)`
of epoch p // n (data/permutation.py's keyed permutation, as token stores shuffle), or record
p mod n unshuffled: any step's prompts are computed directly, so a checkpoint need store only
the position (`position_after`), or the step where the prompts per step stay fixed, and
`fingerprint` tells a resume that the set changed.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
from typing import Any, Sequence

import numpy as np
from absl import logging

from lingvo_lite import input_files
from lingvo_lite.data.permutation import KeyedPermutation
from lingvo_lite.data.prompt_records import RecordError, checked_record
from lingvo_lite.data.source import local_rows
from lingvo_lite.errors import DataError, config_error, one_line, shown
from lingvo_lite.fields import NonNegativeInt, PositiveInt

def _lines(path: str) -> list[tuple[int, bytes]]:
  data = input_files.read_bytes(path, f"prompt file {path}")
  found = []
  for number, line in enumerate(data.split(b"\n"), 1):
    line = line[:-1] if line.endswith(b"\r") else line
    if line.strip():
      found.append((number, line))
  return found


def _constant(name: str) -> None:
  raise RecordError(f"holds {name}, which JSON does not allow")


def _parsed(line: bytes) -> Any:
  try:
    return json.loads(line.decode("utf-8"), parse_constant=_constant)
  except UnicodeDecodeError as e:
    raise RecordError(f"not valid UTF-8 (byte 0x{line[e.start]:02x} at offset {e.start})"
                      ) from None
  except json.JSONDecodeError as e:
    raise RecordError(f"not valid JSON ({e.msg} at column {e.colno})") from None
  except RecursionError:
    raise RecordError("nested too deeply to read") from None
  except ValueError as e:  # An integer of more digits than Python converts.
    raise RecordError(f"not readable JSON ({one_line(str(e))[:120]})") from None


@dataclasses.dataclass(frozen=True)
class LoadedPrompts:
  """A prompt set as read: its records, and what was left out."""
  records: tuple[dict, ...]
  skipped: int
  first_skipped: str | None
  fingerprint: str


def load(patterns: Sequence[str], skip_bad_records: bool = False,
         required_fields: Sequence[str] = (), field: str = "files") -> LoadedPrompts:
  """Every record of the files `patterns` match (module doc), checked.

  Raises:
    UsageError: naming `field`: a pattern that matches no file, or only folders; no usable
      record.
    DataError: `<path>: line N: <why>` for the first bad record (without `skip_bad_records`),
      or a file that cannot be read.
  """
  paths = []
  for pattern in patterns:
    matched = sorted(glob.glob(pattern))
    if not matched:
      raise config_error(field, pattern, "matches no file", "give JSON-lines files of prompt "
                         "records (bin/make_prompts.py writes some)")
    # A folder is the user's pattern at fault, not data that failed to read (as for a token
    # store's files): one a pattern such as `prompts/*` also matches is passed over.
    files = [path for path in matched if not os.path.isdir(path)]
    if not files:
      raise config_error(field, pattern, f"matches {len(matched)} folder(s) but no file",
                         "give JSON-lines files of prompt records, e.g. FOLDER/*.jsonl")
    paths.extend(path for path in files if path not in paths)
  records, skipped, first, seen = [], 0, None, {}
  digest = hashlib.sha256()
  for path in paths:
    try:
      lines = _lines(path)
    except OSError as e:
      raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    for number, line in lines:
      where = f"{path}: line {number}"
      try:
        record = checked_record(_parsed(line), required_fields)
        key = (type(record["id"]).__name__, record["id"])
        if key in seen:
          raise RecordError(f"'id' {shown(record['id'], 60)} is also {seen[key]}'s")
      except RecordError as e:
        if not skip_bad_records:
          raise DataError(one_line(f"{where}: {e}")) from None
        skipped, first = skipped + 1, first or one_line(f"{where}: {e}")
        continue
      seen[key] = where
      records.append(record)
      digest.update(json.dumps(record, sort_keys=True).encode() + b"\n")
  if not records:
    raise config_error(field, list(patterns), f"holds no usable prompt record ({skipped} bad)"
                       + (f"; the first: {first}" if first else ""), "give prompt records")
  return LoadedPrompts(tuple(records), skipped, first, digest.hexdigest()[:16])


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptData:
  """A prompt set as a stream of records (see the module doc).

  Attributes:
    files: A glob pattern, or several, of JSON-lines files of prompt records.
    prompts_per_step: Prompts drawn per step, over all processes.
    shuffle: Visit each epoch in a fresh permutation seeded by (seed, epoch); False: in order.
    seed: Root of the shuffle.
    skip_bad_records: Leave out (and count) bad records instead of refusing the set.
    required_fields: Fields every record must have (what the run's rewards read).
  """

  files: str | tuple[str, ...]
  prompts_per_step: PositiveInt
  shuffle: bool = True
  seed: NonNegativeInt = 0
  skip_bad_records: bool = False
  required_fields: tuple[str, ...] = ()

  def __post_init__(self):
    for name, low in (("prompts_per_step", 1), ("seed", 0)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise config_error(name, value, f"is not an integer of at least {low}")
    if isinstance(self.files, list):  # As a config or JSON may give it.
      object.__setattr__(self, "files", tuple(self.files))
    if not all(isinstance(p, str) and p.strip() for p in self.patterns) or not self.patterns:
      raise config_error("files", self.files, "is not a glob pattern or a tuple of them",
                         "e.g. files='data/arithmetic/train.jsonl'")
    object.__setattr__(self, "required_fields", tuple(self.required_fields))

  @property
  def patterns(self) -> tuple[str, ...]:
    return (self.files,) if isinstance(self.files, str) else tuple(
        self.files if isinstance(self.files, tuple) else (self.files,))

  def loaded(self) -> LoadedPrompts:
    """The set, read and checked once per source."""
    cached = self.__dict__.get("_loaded")
    if cached is None:
      cached = load(self.patterns, self.skip_bad_records, self.required_fields)
      object.__setattr__(self, "_loaded", cached)
    return cached

  def check(self) -> None:
    """Reads the set before a run starts: a bad record is one line (module doc), the count of
    those skipped one warning."""
    loaded = self.loaded()
    if loaded.skipped:
      logging.warning("%s: %d of %d prompt records are bad and left out (the first: %s)",
                      ", ".join(self.patterns), loaded.skipped,
                      loaded.skipped + len(loaded.records), loaded.first_skipped)

  @property
  def records(self) -> tuple[dict, ...]:
    return self.loaded().records

  @property
  def fingerprint(self) -> str:
    """A hash of the records kept, for a checkpoint to tell that its set changed."""
    return self.loaded().fingerprint

  def records_at(self, positions: np.ndarray | Sequence[int]) -> list[dict]:
    """The records at stream positions `positions` (module doc)."""
    records = self.records
    count = len(records)
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size and positions.min() < 0:
      raise ValueError(f"stream positions start at 0, not {int(positions.min())}")
    epochs, offsets = np.divmod(positions, count)
    chosen = offsets.copy()
    if self.shuffle:
      for epoch in np.unique(epochs):
        selected = epochs == epoch
        chosen[selected] = KeyedPermutation(count, self.seed, int(epoch))(offsets[selected])
    return [records[int(index)] for index in chosen]

  def step_records(self, step: int, process_index: int = 0, process_count: int = 1
                   ) -> list[dict]:
    """This process's records of step `step`: positions step * prompts_per_step + its rows."""
    if self.prompts_per_step % process_count:
      raise config_error("prompts_per_step", self.prompts_per_step,
                         f"not divisible by {process_count} processes",
                         f"use a multiple of {process_count}")
    rows = local_rows(self.prompts_per_step, process_index, process_count)
    return self.records_at(step * self.prompts_per_step + rows)

  def position_after(self, step: int) -> int:
    """The stream position after `step` steps: what a checkpoint stores to resume the order
    even if `prompts_per_step` changes (`records_at(range(p, p + n))`)."""
    return step * self.prompts_per_step
