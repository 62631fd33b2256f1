"""Where metrics go: JSON lines, TensorBoard scalars, and a progress line on stdout.

Only process 0 writes. TensorBoard gets each metric as a plain scalar in event files written
without TensorFlow (`event_files`); where TensorBoard is not installed (the synthetic-data path
on an accelerator host) they are skipped with a note and the JSON lines remain.

Longer than 300 lines with a reason: `MetricsWriter` (its commit and rollback are most of the
length) and the functions that read and trim its files (`logged_steps`, `read_rows`, `keep_rows`)
share one row format and its parsing; `Throughput` computes the rates that the progress line and
those rows report.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import time
from typing import Callable, Iterator, Mapping

from etils import epath

from lingvo_lite import file_writes, input_files
from lingvo_lite.runtime import event_files


def log(message: str, enabled: bool = True) -> None:
  if enabled:
    print(message, flush=True)


def format_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  if hours:
    return f"{hours}h{minutes:02d}m"
  if minutes:
    return f"{minutes}m{seconds:02d}s"
  return f"{seconds}s"


class MetricsWriter:
  """Appends `{"step": ..., **metrics}` to a JSONL file and mirrors scalars to TensorBoard.

  Rows are appended as they come, so a user can watch the file. What a run writes is
  provisional until the checkpoint it belongs to is verified: the train program then calls
  `commit(step)`, and the rows of steps up to `step` are the job's for good, whatever happens
  after. `rollback()`, for a run that fails, takes back the rows written since the last commit
  (every row, before the first) and nothing else. So after any failure the files hold exactly
  the rows up to the newest verified step, one per step:

  - This writer appends in step order, so the rows up to a committed step are a prefix of what
    it wrote: a rollback cuts the JSONL file and its own TensorBoard event file back to the end
    of that prefix, which needs no free space (a full disk is a reason to roll back). Without a
    commit, a new job's JSONL file is removed, and so are the event file and the folders this
    writer created.
  - A run that resumes from a checkpoint (`resumed_from`) first cuts the JSONL file and the
    event files already in `tensorboard_dir` (the earlier runs') back to the rows up to that
    step, one per step: a run killed after that checkpoint wrote rows past it that no
    checkpoint covers. Those rows are the files' last ones, so the cut is in place and needs no
    free space (a file whose rows are out of order, left by an older version, is rewritten
    whole). This run's rows follow.
  - A row of a step the file holds already (a finished job rerun evaluates its last step
    again) replaces the old one at the first commit: the file is rewritten (a new file renamed
    over the old one) and the old step's events dropped. Should that rewrite fail (a full
    disk), the step keeps its old row and this run's rows are cut off (the run fails).

  `resumed_from=None` keeps every existing row (plain appending); `commit()` without a step
  keeps every row written so far. The TensorBoard writer opens at the first write, so a run
  that fails before its first metric creates no event file.
  """

  def __init__(self, jsonl_path: epath.Path, tensorboard_dir: epath.Path | None,
               enabled: bool = True, resumed_from: int | None = None):
    self._enabled = enabled
    self._jsonl_path = jsonl_path
    self._tensorboard_dir = tensorboard_dir
    self._tensorboard: event_files.ScalarEvents | None = None
    self._tensorboard_opened = False
    self._events_path: epath.Path | None = None  # The event file this writer created.
    self._rolled_back = False
    self._closed = False
    self._folder_made = False
    # What a rollback keeps: the JSONL file's first `_kept_length` bytes (None: no file) and
    # the event file's first `_events_kept` (0: no event file).
    self._kept_length: int | None = None
    self._events_kept = 0
    self._length = 0  # The JSONL file's length, as this writer left it.
    # (step, JSONL end, event file end) of each row written since the last commit, in order.
    self._pending: list[tuple[int, int, int]] = []
    # This run's rows until its first commit, for the rewrite a row replacing one of the
    # `_earlier` rows (those of a resumed job, up to `resumed_from`) needs then.
    self._earlier = b""
    self._replaces = resumed_from is not None
    self._own_rows: list[tuple[int, bytes]] = []
    if not enabled:
      return
    earlier = jsonl_path.read_bytes() if jsonl_path.exists() else None
    if earlier is not None and resumed_from is not None:
      kept = _last_rows(earlier, lambda step: step <= resumed_from).encode()
      file_writes.shrink(jsonl_path, earlier, kept)
      earlier = kept
    if earlier is not None:
      self._earlier = earlier
      self._kept_length = self._length = len(earlier)
    self._needs_newline = bool(earlier) and not earlier.endswith(b"\n")
    folders = _missing_folders(jsonl_path.parent)
    self._earlier_events: list[epath.Path] = []
    if tensorboard_dir is not None:
      folders += _missing_folders(tensorboard_dir)
      if tensorboard_dir.is_dir():
        self._earlier_events = sorted(p for p in tensorboard_dir.iterdir()
                                      if event_files.is_events(p))
      for path in self._earlier_events if resumed_from is not None else ():
        event_files.drop_events(path, lambda step: step > resumed_from)
    # Deepest first, so a folder is tried after the ones inside it.
    self._created_folders = sorted(set(folders), key=lambda p: len(p.parts), reverse=True)
    if tensorboard_dir is not None:
      try:
        event_files.ScalarEvents.prepare()
      except ImportError:
        pass  # The first write says so.

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    """Appends a row (and its TensorBoard event).

    Raises:
      OSError: the write failed (naming the file); a rollback takes the row back.
    """
    if not self._enabled:
      return
    if self._closed:
      raise RuntimeError(f"MetricsWriter({self._jsonl_path}) is closed")
    step = int(step)
    record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
    line = (json.dumps(record) + "\n").encode()
    # A run killed mid-row left half a line: this row starts a line of its own.
    data = (b"\n" if self._needs_newline else b"") + line
    with file_writes.writing(self._jsonl_path):
      if not self._folder_made:
        self._jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        self._folder_made = True
      with self._jsonl_path.open("ab") as f:
        f.write(data)
    self._length += len(data)
    self._needs_newline = False
    if self._replaces:
      self._own_rows.append((step, line))
    events_end = self._tensorboard.length if self._tensorboard is not None else 0
    self._pending.append((step, self._length, events_end))
    tensorboard = self._tensorboard_writer()
    if tensorboard is not None:
      tensorboard.write_scalars(step, {k: event_files.float32(v) for k, v in metrics.items()})
      self._pending[-1] = (step, self._length, tensorboard.length)

  def commit(self, step: int | None = None) -> None:
    """The rows of steps up to `step` (all rows, without one) are the job's: no rollback takes
    them back. The first commit of a resumed run also replaces the rows of steps it wrote
    again (see the class doc).

    Raises:
      OSError: that rewrite failed (naming the file); this run's rows are cut off.
    """
    if not self._enabled or self._rolled_back:
      return
    kept = 0  # Rows come in step order: those up to `step` are the first ones.
    while kept < len(self._pending) and (step is None or self._pending[kept][0] <= step):
      kept += 1
    if kept:
      _, self._kept_length, events_end = self._pending[kept - 1]
      self._events_kept = events_end or self._events_kept
      del self._pending[:kept]
    if self._replaces:
      self._replaces = False  # Tried once: a failure stops the run.
      own, self._own_rows = self._own_rows, []
      earlier_steps = set(_row_steps(self._earlier))
      if earlier_steps and any(s <= max(earlier_steps) for s, _ in own):
        self._replace_earlier_rows(own)

  def _replace_earlier_rows(self, own: list[tuple[int, bytes]]) -> None:
    """Rewrites the JSONL file as the earlier rows but those of this run's steps, then this
    run's rows, keeping track of where they now end; then drops those steps' earlier events
    (the last ones of their files: cut in place). On failure, cuts this run's rows off."""
    steps = {step for step, _ in own}
    earlier = _last_rows(self._earlier, lambda step: step not in steps).encode()
    try:
      file_writes.replace(self._jsonl_path, earlier + b"".join(row for _, row in own))
    except OSError:
      self._cut_own_rows()
      raise
    # The file is now the earlier rows, then this run's: committed ones, then pending ones.
    ends = list(itertools.accumulate((len(row) for _, row in own), initial=len(earlier)))
    committed = len(own) - len(self._pending)
    self._kept_length = ends[committed]
    self._pending = [(step, ends[committed + 1 + i], events_end)
                     for i, (step, _, events_end) in enumerate(self._pending)]
    self._length = ends[-1]
    for path in self._earlier_events:
      event_files.drop_events(path, lambda step: step in steps)

  def _cut_own_rows(self) -> None:
    """After a failed rewrite: the files as they were when this writer opened them (the
    earlier rows, the earlier events), in place; a failure to is left to the rollback."""
    self.close()
    self._kept_length, self._events_kept, self._pending = len(self._earlier), 0, []
    with contextlib.suppress(OSError):
      file_writes.truncate(self._jsonl_path, len(self._earlier))
      if self._events_path is not None and self._events_path.exists():
        self._events_path.unlink()

  def rollback(self) -> None:
    """Takes back the rows written since the last commit (see the class doc); closes the
    writer.

    Raises:
      OSError: cutting a file back failed (naming it).
    """
    with contextlib.suppress(OSError):  # A failed write fails its flush again: cut off below.
      self.close()
    if not self._enabled or self._rolled_back:
      return
    self._rolled_back = True
    self._pending = []
    if self._kept_length is None:
      if self._jsonl_path.exists():
        self._jsonl_path.unlink()
    elif self._jsonl_path.exists() and self._jsonl_path.stat().length != self._kept_length:
      file_writes.truncate(self._jsonl_path, self._kept_length)
    if self._events_path is not None and self._events_path.exists():
      if self._events_kept:
        file_writes.truncate(self._events_path, self._events_kept)
      else:
        self._events_path.unlink()
    if self._kept_length is None and not self._events_kept:
      for folder in self._created_folders:
        try:
          if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        except OSError:
          pass  # Not ours to insist on: an object store has no real folders, for one.

  def flush(self) -> None:
    """Makes what was written durable in TensorBoard's files too (rows are at once)."""
    if self._tensorboard is not None:
      self._tensorboard.flush()

  def close(self) -> None:
    self._closed = True
    tensorboard, self._tensorboard = self._tensorboard, None
    if tensorboard is not None:
      tensorboard.close()

  def _tensorboard_writer(self) -> event_files.ScalarEvents | None:
    if not self._tensorboard_opened and self._tensorboard_dir is not None:
      self._tensorboard_opened = True
      try:
        self._tensorboard = event_files.ScalarEvents(str(self._tensorboard_dir))
      except ImportError as e:
        log(f"TensorBoard summaries disabled ({e}); metrics still go to {self._jsonl_path}")
      else:
        self._events_path = self._tensorboard.path
    return self._tensorboard


def logged_steps(jsonl_path: epath.Path) -> list[int]:
  """The steps of a metrics file's rows (none when it does not exist)."""
  return sorted(set(_row_steps(jsonl_path.read_bytes() if jsonl_path.exists() else None)))


def read_rows(jsonl_path: epath.Path, keep: Callable[[int], bool] = lambda step: True
              ) -> list[dict]:
  """The rows of the steps `keep` says, the last written of each, in step order (none when
  the file does not exist)."""
  data = jsonl_path.read_bytes() if jsonl_path.exists() else None
  return [input_files.json_value(line) for line in _last_rows(data, keep).splitlines()]


def keep_rows(jsonl_path: epath.Path, tensorboard_dir: epath.Path | None,
              keep: Callable[[int], bool]) -> None:
  """Rewrites a metrics file (and its TensorBoard events) with only the steps `keep` says,
  one row per step (the last written): for a writer whose own record says which rows count
  (the eval program's, after a kill between a row and its record)."""
  if jsonl_path.exists():
    data = jsonl_path.read_bytes()
    file_writes.shrink(jsonl_path, data, _last_rows(data, keep).encode())
  if tensorboard_dir is not None and tensorboard_dir.is_dir():
    for path in sorted(tensorboard_dir.iterdir()):
      if event_files.is_events(path):
        event_files.drop_events(path, lambda step: not keep(step))


def _missing_folders(folder: epath.Path) -> list[epath.Path]:
  """`folder` and its ancestors that do not exist yet."""
  missing = []
  while not folder.exists() and folder.parent != folder:
    missing.append(folder)
    folder = folder.parent
  return missing


def _lines(data: bytes | None) -> list[str]:
  return data.decode(errors="replace").splitlines() if data else []


def _last_rows(data: bytes | None, keep: Callable[[int], bool]) -> str:
  """The rows of the steps `keep` says, the last written of each, in step order (a killed run
  leaves half a row, which has no step and goes)."""
  latest: dict[int, str] = {}
  for line in _lines(data):
    step = _row_step(line)
    if step is not None and keep(step):
      latest[step] = line + "\n"
  return "".join(latest[step] for step in sorted(latest))


def _row_steps(data: bytes | None) -> list[int]:
  """The steps of the rows in `data`, in file order (a line that is not a row has none)."""
  return [step for step in map(_row_step, _lines(data)) if step is not None]


def _row_step(line: str) -> int | None:
  """The step of a JSONL row; None for a line that is not one (half a row, left by a kill)."""
  try:
    step = input_files.json_value(line).get("step")
  except (ValueError, AttributeError):
    return None
  return step if isinstance(step, int) else None


class Throughput:
  """Steps/s, tokens/s, model TFLOP per step, TFLOP/s per device, MFU, data wait and ETA,
  over the steps since the last report, not counting the time spent off the steps
  (`excluded`: compiling, checkpointing, evaluating), which each report gives by kind.

  A peak is the best the device was seen to do: steps whose FLOP/s beat it raise it to theirs
  (and `on_new_peak(flops)` is told, to keep it), so MFU never reads above 1."""

  # What the train loop does besides steps; each report row has `<kind>_s` for each.
  OFF_STEP_KINDS = ("compile", "checkpoint", "eval")

  def __init__(self, start_step: int, total_steps: int, tokens_per_step: int,
               flops_per_step: float, num_devices: int, peak_flops_per_device: float,
               on_new_peak: Callable[[float], None] | None = None):
    self._total_steps = total_steps
    self._tokens_per_step = tokens_per_step
    self._flops_per_step = flops_per_step
    self._flops_per_device_step = flops_per_step / num_devices
    self._peak = peak_flops_per_device
    self._on_new_peak = on_new_peak
    self._last_step = start_step
    self._last_time = time.perf_counter()
    self._data_wait = 0.0
    self._excluded = dict.fromkeys(self.OFF_STEP_KINDS, 0.0)

  def add_data_wait(self, seconds: float) -> None:
    self._data_wait += seconds

  def exclude(self, seconds: float, kind: str = "eval") -> None:
    """Time spent on something other than steps, kept out of the figures."""
    self._excluded[kind] += seconds

  @contextlib.contextmanager
  def excluded(self, kind: str) -> Iterator[None]:
    """Times the block and `exclude`s it. The caller first waits for the steps already
    dispatched (their time is theirs, not the block's)."""
    start = time.perf_counter()
    try:
      yield
    finally:
      self.exclude(time.perf_counter() - start, kind)

  def report(self, step: int) -> dict[str, float]:
    now = time.perf_counter()
    steps = max(step - self._last_step, 1)
    elapsed = max(now - self._last_time - sum(self._excluded.values()), 1e-9)
    step_time = elapsed / steps
    achieved = self._flops_per_device_step / step_time
    if achieved > self._peak:
      self._peak = achieved
      if self._on_new_peak is not None:
        self._on_new_peak(achieved)
    report = {
        "step_time_s": step_time,
        "steps_per_s": 1.0 / step_time,
        "tokens_per_s": self._tokens_per_step / step_time,
        "model_tflop_per_step": self._flops_per_step / 1e12,
        "tflops_per_device": achieved / 1e12,
        "mfu": achieved / self._peak,
        "data_wait_s": self._data_wait / steps,
        "eta_s": (self._total_steps - step) * step_time,
        **{f"{kind}_s": seconds for kind, seconds in self._excluded.items()},
    }
    self._last_step, self._last_time, self._data_wait = step, now, 0.0
    self._excluded = dict.fromkeys(self.OFF_STEP_KINDS, 0.0)
    return report
