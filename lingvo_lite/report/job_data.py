"""A job directory read into plain data for the run report (`--mode=report`).

What is read: the train rows (`metrics.jsonl`), the eval rows of the training run
(`eval_<set>.jsonl`) and of the eval program (`eval/eval_<set>.jsonl`), the checkpoint steps
with their verification status, the compile report (`compile/report.json`), the newest
decode answers (`decode/*.jsonl`) and the run's starts (`run_info.jsonl`).

A report is made while a trainer may be writing the same folder, so nothing here takes the
job's lock and everything expects files in motion: a last JSON line still being written
(skipped), an eval set's first file appearing, a checkpoint step being written (no checksums
yet) or deleted between the listing and the reading (left out). Older jobs lack some files;
what is missing or unreadable becomes a note on the page, not an error. Nothing is written:
the program keeps the verification cache (`checked`) under JOB/report/.

The files may also be damaged or crafted, so every value is taken through one coercion:
`number` for numbers (a JSON integer too large for a float is an infinity, a string is no
number), `step_of` for steps, `text` for names that come from the file system (a name that is
not UTF-8 keeps its bytes as `\\xff` escapes), and a local file that is not a regular file (a
FIFO would block the read for ever) is left out with a note.

Longer than 300 lines with a reason: every file of the job dir (rows, checkpoints, compile report,
decode answers, run starts) is read through the same coercions and notes (`number`, `step_of`,
`text`, special files), and `read` gathers them into one `Job`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any

from etils import epath

from lingvo_lite import input_files, paths
from lingvo_lite.checkpoints import integrity as checkpoint_integrity
from lingvo_lite.runtime import run_info

METRICS_FILE = "metrics.jsonl"
EVAL_FOLDER = "eval"  # The eval program's rows (programs/eval.py); the trainer's are beside.
CHECKPOINTS_FOLDER = "checkpoints"
COMPILE_REPORT = "compile/report.json"
DECODE_FOLDER = "decode"
DECODE_SAMPLES = 6  # Answers shown from the newest decode file.
# Step folder names, as checkpoints.py makes them: final (`30`), being written by orbax
# (`30.orbax-checkpoint-tmp-<ns>`), set aside unverified (`30.unverified-<ns>`); the ones being
# deleted (`30.lingvo_lite-deleting-<ns>`) are left out.
_FINAL = re.compile(r"^([0-9]+)$")
_BEING_WRITTEN = re.compile(r"^([0-9]+)\.orbax-checkpoint-tmp")
_SET_ASIDE = re.compile(r"^([0-9]+)\.unverified-")
# The largest step taken as one (an int64, as orbax and TensorBoard store steps): larger
# integers in a row are damage, and would overflow the float a plot's axis needs.
MAX_STEP = 2**63 - 1
_STEP_METADATA = "_CHECKPOINT_METADATA"

VERIFIED, BEING_WRITTEN, INCOMPLETE, FAILED, SET_ASIDE = (
    "verified", "being written", "incomplete", "FAILED", "set aside")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """One step folder under JOB/checkpoints.

  Attributes:
    step: The training step it holds.
    status: VERIFIED, BEING_WRITTEN, INCOMPLETE, FAILED or SET_ASIDE.
    detail: Why, in words (for FAILED: the first file that differs).
    committed: When orbax committed it (POSIX seconds), if known.
    size: Bytes of its files, if known.
    checked: When its CRC-32s were last compared with the files (POSIX seconds), if they were.
  """

  step: int
  status: str
  detail: str
  committed: float | None
  size: int | None
  checked: float | None = None


@dataclasses.dataclass(frozen=True)
class Job:
  """What the report shows of one job dir (rows are JSON objects as written).

  Attributes:
    path: The job dir.
    shown: The job dir as the user wrote it.
    starts: The rows of run_info.jsonl, oldest first ([] where not recorded).
    train: metrics.jsonl's rows, one per step: where a resumed run wrote a step again, its
      rows replace those a killed earlier run wrote past the restored step.
    train_evals: Eval set name -> the training run's eval rows, by step.
    program_evals: Eval set name -> the eval program's rows (JOB/eval), by step.
    checkpoints: The step folders, by step.
    compile_report: JOB/compile/report.json, if there is one.
    decode_file: The newest decode file's name, if any.
    decode_samples: Its first DECODE_SAMPLES answers.
    metrics_written: When metrics.jsonl was last written (POSIX seconds), if it exists.
    notes: What could not be read, or is being written, in words.
    checked: The verification cache to keep for the next report (see `read`).
  """

  path: epath.Path
  shown: str
  starts: list[dict[str, Any]]
  train: list[dict[str, Any]]
  train_evals: dict[str, list[dict[str, Any]]]
  program_evals: dict[str, list[dict[str, Any]]]
  checkpoints: list[Checkpoint]
  compile_report: dict[str, Any] | None
  decode_file: str | None
  decode_samples: list[dict[str, Any]]
  metrics_written: float | None
  notes: list[str]
  checked: dict[str, Any]


# ----------------------------------------------------------------------------- values


def text(name: str) -> str:
  """A file or folder name as text that can be written as UTF-8 and drawn: the bytes of a
  name that is not UTF-8 (os.fsdecode's surrogates) become `\\xff` escapes."""
  return os.fsencode(name).decode("utf-8", "backslashreplace")


def printable(value: Any) -> str:
  """`value` as text that can be written as UTF-8 and drawn: a lone surrogate (from a JSON
  `\\udcff` escape, or a name os.fsdecode made) becomes its `\\udcff` escape."""
  return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def number(row: Any, key: str) -> float | None:
  """`row[key]` as a float if `row` is a JSON object and the value a number (NaN and
  infinities included; an integer too large for a float is an infinity of its sign), else
  None: the one way the report reads a number from a job's files."""
  value = row.get(key) if isinstance(row, dict) else None
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  try:
    return float(value)
  except OverflowError:
    return math.inf if value > 0 else -math.inf


def finite(value: float | None) -> bool:
  return value is not None and math.isfinite(value)


def step_of(row: Any) -> int | None:
  """`row["step"]` if it is an integer from 0 to MAX_STEP, else None (the row is no step's)."""
  value = row.get("step") if isinstance(row, dict) else None
  if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP:
    return value
  return None


def is_special_file(path: epath.Path) -> bool:
  """Whether `path` is a local FIFO, socket or device: reading one could block for ever, so
  the report leaves it out (a missing path or a folder is for the reader to say)."""
  return input_files.kind_of(path) is not None


def _special_note(shown: str) -> str:
  return f"{shown}: not a regular file (a FIFO, socket or device; left out)"


# ----------------------------------------------------------------------------- JSON lines


def read_jsonl(path: epath.Path, notes: list[str], shown: str) -> list[dict[str, Any]]:
  """The JSON objects of a JSON-lines file; [] if it is not there.

  A last line without its newline is a row being written and is left out (the writers
  append whole lines, so it is the only line that can be partial); any other unreadable line
  is left out with a note.
  """
  if is_special_file(path):
    notes.append(_special_note(shown))
    return []
  try:
    data = path.read_bytes()
  except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
    return []
  except OSError as e:
    notes.append(f"{shown}: cannot be read ({e.strerror or e})")
    return []
  lines = data.split(b"\n")
  rows, bad = [], 0
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = input_files.json_value(line)
    except ValueError:  # UnicodeDecodeError too.
      if number == len(lines):
        notes.append(f"{shown}: its last line is being written (left out)")
      else:
        bad += 1
      continue
    if isinstance(row, dict):
      rows.append(row)
    else:
      bad += 1
  if bad:
    notes.append(f"{shown}: {bad} line(s) that are not JSON objects (left out)")
  return rows


def one_row_per_step(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Train rows as the run's history: a row whose step is not after the last one kept starts
  a resumed run, whose rows replace those from that step on (a killed run's rows stay in
  metrics.jsonl until the resumed run's first checkpoint)."""
  kept: list[dict[str, Any]] = []
  for row in rows:
    at = step_of(row)
    if at is None:
      continue
    while kept and step_of(kept[-1]) >= at:
      kept.pop()
    kept.append(row)
  return kept


def latest_per_step(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Eval rows, one per step (the last written wins: a step evaluated again), by step."""
  by_step = {at: row for row in rows if (at := step_of(row)) is not None}
  return [by_step[at] for at in sorted(by_step)]


def _eval_sets(folder: epath.Path, prefix: str, notes: list[str]) -> dict[str, list[dict]]:
  """Set name -> rows of each `eval_<set>.jsonl` in `folder` (shown as `prefix` + name)."""
  try:
    files = sorted(folder.glob("eval_*.jsonl"))
  except OSError:
    return {}
  sets = {}
  for file in files:
    name = text(file.name)
    rows = latest_per_step(read_jsonl(file, notes, prefix + name))
    if rows:
      sets[name[len("eval_"):-len(".jsonl")]] = rows
  return sets


# ----------------------------------------------------------------------------- checkpoints


def _files(step_dir: epath.Path) -> list[epath.Path]:
  return sorted(directory / name for directory, _, names in step_dir.walk() for name in names)


def _signature(step_dir: epath.Path) -> list[list[Any]] | None:
  """What the cached check of a step stands for: each file's name, size, change time and
  inode (a copy or a rewrite changes them); None for a remote job dir (no cache)."""
  if paths.is_remote(str(step_dir)):
    return None
  signature = []
  for path in _files(step_dir):
    stat = os.stat(os.fspath(path))
    signature.append([str(path.relative_to(step_dir)), stat.st_size, stat.st_mtime_ns,
                      stat.st_ino])
  return signature


def _committed(step_dir: epath.Path) -> float | None:
  """When orbax committed the step (POSIX seconds), if its metadata says so."""
  path = step_dir / _STEP_METADATA
  if is_special_file(path):
    return None
  try:
    metadata = input_files.json_value(path.read_text())
  except (OSError, ValueError):
    return None
  nanoseconds = number(metadata, "commit_timestamp_nsecs")
  return nanoseconds / 1e9 if finite(nanoseconds) else None  # The page shows "-" past 9999.


def _size(step_dir: epath.Path) -> int | None:
  try:
    return sum(path.stat().length for path in _files(step_dir))
  except OSError:
    return None


class _ChangedWhileChecked(Exception):
  """A step folder was deleted or rewritten while its files were compared."""


def _final_step(step: int, step_dir: epath.Path, cached: dict[str, Any], now: float,
                checked: dict[str, Any]) -> Checkpoint:
  """A final-named step folder's status. Verifying reads every byte of the step, so a result
  is kept in `checked` with the files' signature and reused while it still matches."""
  committed, size = _committed(step_dir), _size(step_dir)
  if not (step_dir / _STEP_METADATA).exists():
    return Checkpoint(step, INCOMPLETE, f"no {_STEP_METADATA}: an interrupted save or a "
                      "partial copy (the next training run moves it aside)", committed, size)
  if not checkpoint_integrity.has_checksums(step_dir):
    return Checkpoint(step, BEING_WRITTEN, "committed, checksums not recorded yet (the "
                      "trainer records them at the next step boundary; a run stopped before "
                      "that leaves the step unverified)", committed, size)
  signature = _signature(step_dir)
  entry = cached.get(str(step))
  if (signature is not None and isinstance(entry, dict) and entry.get("signature") == signature
      and finite(number(entry, "checked"))
      and isinstance(entry.get("mismatch"), (str, type(None)))):
    mismatch, when = entry.get("mismatch"), number(entry, "checked")
  else:
    mismatch, when = checkpoint_integrity.first_mismatch(step_dir), now
    # Retention (or a resumed run saving the step again) may have deleted or replaced the
    # step while it was read: its files differ then because they are gone, not damaged.
    if mismatch and (not step_dir.exists() or _signature(step_dir) != signature):
      raise _ChangedWhileChecked()
  if signature is not None:
    checked[str(step)] = {"signature": signature, "mismatch": mismatch, "checked": when}
  if mismatch:
    return Checkpoint(step, FAILED, mismatch, committed, size, when)
  return Checkpoint(step, VERIFIED, "every file's size and CRC-32 match", committed, size, when)


def read_checkpoints(folder: epath.Path, cached: dict[str, Any], now: float,
                     notes: list[str]) -> tuple[list[Checkpoint], dict[str, Any]]:
  """The step folders under `folder`, by step, and the verification cache to keep."""
  checked: dict[str, Any] = {}
  try:
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
  except OSError as e:
    notes.append(f"{folder.name}/: cannot be listed ({e.strerror or e})")
    return [], checked
  found = []
  for path in entries:
    name = text(path.name)
    try:
      if match := _FINAL.match(name):
        found.append(_final_step(int(match[1]), path, cached, now, checked))
      elif match := _BEING_WRITTEN.match(name):
        found.append(Checkpoint(int(match[1]), BEING_WRITTEN, "orbax is writing it",
                                None, _size(path)))
      elif match := _SET_ASIDE.match(name):
        found.append(Checkpoint(int(match[1]), SET_ASIDE, f"moved aside as {name}: its run "
                                "stopped before recording checksums", _committed(path),
                                _size(path)))
    except (FileNotFoundError, NotADirectoryError):
      continue  # Deleted (retention) or renamed into place since the listing.
    except _ChangedWhileChecked:
      if path.exists():  # Rewritten: the next report checks the new files (none cached).
        notes.append(f"{folder.name}/{name}: changed while it was checked (left out)")
    except OSError as e:
      notes.append(f"{folder.name}/{name}: cannot be read ({e.strerror or e})")
  return sorted(found, key=lambda c: (c.step, c.status != VERIFIED)), checked


# ----------------------------------------------------------------------------- other files


def _json_file(path: epath.Path, shown: str, notes: list[str]) -> dict[str, Any] | None:
  if is_special_file(path):
    notes.append(_special_note(shown))
    return None
  try:
    data = input_files.json_value(path.read_text())
  except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
    return None
  except (OSError, ValueError) as e:
    notes.append(f"{shown}: unreadable ({type(e).__name__})")
    return None
  if not isinstance(data, dict):
    notes.append(f"{shown}: not a JSON object")
    return None
  return data


def _decode_samples(folder: epath.Path, shown: str,
                    notes: list[str]) -> tuple[str | None, list[dict[str, Any]]]:
  """The newest decode file (their names are UTC times) and its first answers of schema 1."""
  try:
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
  except OSError:
    return None, []
  for file in reversed(files):
    name = text(file.name)
    rows = [row for row in read_jsonl(file, notes, f"{shown}/{name}")
            if row.get("schema_version") == 1]
    if rows:
      return name, rows[:DECODE_SAMPLES]
  return None, []


def _mtime(path: epath.Path) -> float | None:
  try:
    return float(path.stat().mtime)
  except OSError:
    return None


def read(job_dir: epath.Path, shown: str, cached: dict[str, Any] | None = None,
         now: float = 0.0, with_checkpoints: bool = True) -> Job:
  """Reads the job dir `job_dir` (shown as `shown`).

  Args:
    job_dir: The job dir.
    shown: How messages and the page name it.
    cached: The previous report's `Job.checked` (None or {}: verify every step).
    now: The time to record for a verification made now (POSIX seconds).
    with_checkpoints: List and verify the checkpoints (False: `checkpoints` is []).
  """
  notes: list[str] = []
  starts = []
  if is_special_file(job_dir / run_info.FILE_NAME):
    notes.append(_special_note(run_info.FILE_NAME))
  else:
    try:
      starts = run_info.read(job_dir)
    except (OSError, ValueError) as e:
      notes.append(f"{run_info.FILE_NAME}: cannot be read ({type(e).__name__})")
  train = one_row_per_step(read_jsonl(job_dir / METRICS_FILE, notes, METRICS_FILE))
  checkpoints, checked = (read_checkpoints(job_dir / CHECKPOINTS_FOLDER, cached or {}, now,
                                           notes) if with_checkpoints else ([], {}))
  decode_file, decode_samples = _decode_samples(job_dir / DECODE_FOLDER, DECODE_FOLDER, notes)
  return Job(
      path=job_dir, shown=shown, starts=starts, train=train,
      train_evals=_eval_sets(job_dir, "", notes),
      program_evals=_eval_sets(job_dir / EVAL_FOLDER, f"{EVAL_FOLDER}/", notes),
      checkpoints=checkpoints,
      compile_report=_json_file(job_dir / COMPILE_REPORT, COMPILE_REPORT, notes),
      decode_file=decode_file, decode_samples=decode_samples,
      metrics_written=_mtime(job_dir / METRICS_FILE), notes=notes, checked=checked)
