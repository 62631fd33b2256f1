"""Where metrics go: JSON lines, TensorBoard scalars, and a progress line on stdout.

Only process 0 writes. TensorBoard gets each metric as a plain scalar (`simple_value`), the
kind its standard readers list (`EventAccumulator.Scalars`); TensorFlow's summary ops, which
clu's writer uses, store scalars as tensors that those readers do not see. The event files
are written here (TFRecords of TensorBoard's Event protos: `ScalarEvents`), without
TensorFlow; where TensorBoard is not installed (the synthetic-data path on an accelerator
host) they are skipped with a note and the JSON lines remain.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import struct
import time
from typing import Callable, Iterator, Mapping

from etils import epath



def _crc32c_table() -> list[int]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    table.append(crc)
  return table


_CRC32C_TABLE = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
  """TFRecord's checksum: CRC-32C (Castagnoli), rotated and offset ("masked")."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
  """One TFRecord: length, its masked CRC, the data, the data's masked CRC."""
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", _masked_crc32c(length)) + data
          + struct.pack("<I", _masked_crc32c(data)))


class ScalarEvents:
  """A TensorBoard event file of scalars, one event per step.

  The file is TFRecords of TensorBoard's Event protos, written here rather than through
  TensorBoard's writer: that one's file layer is TensorFlow's wherever TensorFlow is installed,
  and importing TensorFlow takes 5 to 15 s, longer than a small run's training. Each event is
  flushed as it is written, so TensorBoard (and a killed run's job dir) sees every step logged.
  """

  _serial = 0  # Two writers of one process in one second still get two files.

  def __init__(self, logdir: str):
    # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto import event_pb2, summary_pb2
    self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
    ScalarEvents._serial += 1
    folder = epath.Path(logdir)
    folder.mkdir(parents=True, exist_ok=True)
    # TensorBoard's own naming: it reads the files whose names hold "tfevents".
    self.path = folder / (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
                          f".{os.getpid()}.{ScalarEvents._serial}.v2")
    self._file = self.path.open("wb")
    self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

  @staticmethod
  def prepare() -> None:
    """Imports what the first event file needs, so the first metric row costs no import.
    Raises ImportError where TensorBoard is not installed."""
    # pylint: disable-next=g-import-not-at-top,unused-import
    from tensorboard.compat.proto import event_pb2, summary_pb2

  def _write(self, event) -> None:
    self._file.write(tfrecord(event.SerializeToString()))
    self._file.flush()

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    values = [self._summary_pb2.Summary.Value(tag=tag, simple_value=value)
              for tag, value in scalars.items()]
    self._write(self._event_pb2.Event(
        wall_time=time.time(), step=int(step), summary=self._summary_pb2.Summary(value=values)))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


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

  Rows are appended as they come, so a user can watch the file. A run that resumes from a
  checkpoint (`resumed_from`) must end with one row per step, although the run it resumes
  (killed after that checkpoint) may have written rows past it. So whatever a run writes is
  provisional until `commit()`, which the train program calls once a checkpoint of this run
  is safely written:

  - `commit()` rewrites the JSONL file (a new file renamed over the old one) as the rows it
    held with `step <= resumed_from` that this run did not write again, then this run's rows.
    It also drops the same rows from the TensorBoard event files already in
    `tensorboard_dir` (those of the earlier runs), so every reader of them sees one value per
    step. Later calls do nothing; rows written after it are appended as usual.
  - `rollback()`, for a run that fails before its first commit, puts the JSONL file back as
    it was (byte for byte, or not there), deletes the event files this writer created and
    the folders it created, if empty: the job dir is as before the run.

  `resumed_from=None` keeps every existing row (plain appending); rollback works all the same.
  The TensorBoard writer opens at the first write, so a run that fails before its first
  metric creates no event file. (Between a resume and its first commit, TensorBoard's default
  fast loader already hides a killed run's events past the new run's first step: its
  reservoirs drop points whose step is not below a newly read one. The legacy loader,
  `--load_fast=false`, does not: TF2 event files are version 2, for which it purges only on a
  `SessionLog.START` event, which TF2 writers do not write.)
  """

  def __init__(self, jsonl_path: epath.Path, tensorboard_dir: epath.Path | None,
               enabled: bool = True, resumed_from: int | None = None):
    self._enabled = enabled
    self._jsonl_path = jsonl_path
    self._tensorboard_dir = tensorboard_dir
    self._resumed_from = resumed_from
    self._tensorboard = None
    self._tensorboard_opened = False
    self._committed = False
    self._rolled_back = False
    self._closed = False
    self._folder_made = False
    self._lines: list[str] = []  # This run's rows, until the commit.
    self._steps: set[int] = set()
    if not enabled:
      return
    self._original = jsonl_path.read_bytes() if jsonl_path.exists() else None
    self._needs_newline = bool(self._original) and not self._original.endswith(b"\n")
    folders = _missing_folders(jsonl_path.parent)
    self._earlier_events: list[epath.Path] = []
    if tensorboard_dir is not None:
      folders += _missing_folders(tensorboard_dir)
      if tensorboard_dir.is_dir():
        self._earlier_events = sorted(p for p in tensorboard_dir.iterdir() if _is_events(p))
    # Deepest first, so a folder is tried after the ones inside it.
    self._created_folders = sorted(set(folders), key=lambda p: len(p.parts), reverse=True)
    if tensorboard_dir is not None:
      try:
        ScalarEvents.prepare()
      except ImportError:
        pass  # The first write says so.

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    if not self._enabled:
      return
    if self._closed:
      raise RuntimeError(f"MetricsWriter({self._jsonl_path}) is closed")
    record = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
    line = json.dumps(record) + "\n"
    if not self._folder_made:
      self._jsonl_path.parent.mkdir(parents=True, exist_ok=True)
      self._folder_made = True
    with self._jsonl_path.open("a") as f:
      # A run killed mid-row left half a line: this row starts a line of its own.
      f.write(("\n" if self._needs_newline else "") + line)
    self._needs_newline = False
    if not self._committed:
      self._lines.append(line)
      self._steps.add(int(step))
    tensorboard = self._tensorboard_writer()
    if tensorboard is not None:
      tensorboard.write_scalars(int(step), {k: _float32(v) for k, v in metrics.items()})

  def commit(self) -> None:
    """This run's rows are for keeping: drops the rows it supersedes (see the class doc)."""
    if not self._enabled or self._committed or self._rolled_back:
      return
    self._committed = True
    if self._resumed_from is not None:
      # Rows of one step from several earlier runs (killed ones redo steps they had logged
      # past their restored step): the last written is the one on the resumed-from path.
      kept = _last_rows(self._original,
                        lambda step: step <= self._resumed_from and step not in self._steps)
      new = (kept + "".join(self._lines)).encode()
      exists = self._jsonl_path.exists()
      if (new or exists) and not (exists and self._jsonl_path.read_bytes() == new):
        _replace(self._jsonl_path, new)
      for path in self._earlier_events:
        _drop_events(path, lambda step: step > self._resumed_from or step in self._steps)
    self._lines, self._steps = [], set()

  def rollback(self) -> None:
    """Takes back everything this writer wrote, unless it committed; then closes it."""
    self.close()
    if not self._enabled or self._committed or self._rolled_back:
      return
    self._rolled_back = True
    if self._original is None:
      if self._jsonl_path.exists():
        self._jsonl_path.unlink()
    elif self._jsonl_path.read_bytes() != self._original:
      _replace(self._jsonl_path, self._original)
    if self._tensorboard_dir is not None and self._tensorboard_dir.is_dir():
      for path in self._tensorboard_dir.iterdir():
        if _is_events(path) and path not in self._earlier_events:
          path.unlink()
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
    if self._tensorboard is not None:
      self._tensorboard.flush()
      self._tensorboard.close()
      self._tensorboard = None

  def _tensorboard_writer(self):
    if not self._tensorboard_opened and self._tensorboard_dir is not None:
      self._tensorboard_opened = True
      try:
        self._tensorboard = ScalarEvents(str(self._tensorboard_dir))
      except ImportError as e:
        log(f"TensorBoard summaries disabled ({e}); metrics still go to {self._jsonl_path}")
    return self._tensorboard


def logged_steps(jsonl_path: epath.Path) -> list[int]:
  """The steps of a metrics file's rows (none when it does not exist)."""
  data = jsonl_path.read_bytes() if jsonl_path.exists() else None
  return sorted({step for step in map(_row_step, _lines(data)) if step is not None})


def keep_rows(jsonl_path: epath.Path, tensorboard_dir: epath.Path | None,
              keep: Callable[[int], bool]) -> None:
  """Rewrites a metrics file (and its TensorBoard events) with only the steps `keep` says,
  one row per step (the last written): for a writer whose own record says which rows count
  (the eval program's, after a kill between a row and its record)."""
  if jsonl_path.exists():
    data = jsonl_path.read_bytes()
    new = _last_rows(data, keep).encode()
    if new != data:
      _replace(jsonl_path, new)
  if tensorboard_dir is not None and tensorboard_dir.is_dir():
    for path in sorted(tensorboard_dir.iterdir()):
      if _is_events(path):
        _drop_events(path, lambda step: not keep(step))


_FLOAT32_MAX = 3.4028234663852886e38


def _float32(value: float) -> float:
  """A scalar TensorBoard can store: its summaries are float32, and TensorFlow refuses a
  larger number (a diverged model's perplexity of 1e300) rather than round it to inf. The JSON
  lines keep the value itself."""
  value = float(value)
  return math.copysign(math.inf, value) if abs(value) > _FLOAT32_MAX else value


def _missing_folders(folder: epath.Path) -> list[epath.Path]:
  """`folder` and its ancestors that do not exist yet."""
  missing = []
  while not folder.exists() and folder.parent != folder:
    missing.append(folder)
    folder = folder.parent
  return missing


def _is_events(path: epath.Path) -> bool:
  return "tfevents" in path.name and not path.name.startswith(".")


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


def _row_step(line: str) -> int | None:
  """The step of a JSONL row; None for a line that is not one (half a row, left by a kill)."""
  try:
    step = json.loads(line).get("step")
  except (ValueError, AttributeError):
    return None
  return step if isinstance(step, int) else None


def _replace(path: epath.Path, data: bytes) -> None:
  """Writes `path` whole: a reader sees the old file or the new one, never a part."""
  # Not named like the file: TensorBoard would read a `*tfevents*` one as another event file.
  temporary = path.parent / f".lingvo_lite_rewrite.{os.getpid()}.tmp"
  temporary.write_bytes(data)
  temporary.replace(path)


def _drop_events(path: epath.Path, drop: Callable[[int], bool]) -> None:
  """Rewrites an event file without its summaries whose step `drop`s (other events stay).

  An event file is TFRecords: length (8 bytes), its masked CRC (4), the Event proto, the
  proto's masked CRC (4). Kept records are copied whole, CRCs and all; a torn last record
  (a killed writer's) is dropped.
  """
  try:
    from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
  except ImportError:
    return  # No TensorBoard here (nor TensorFlow): this run wrote no events to supersede.
  from google.protobuf.message import DecodeError  # pylint: disable=g-import-not-at-top
  data = path.read_bytes()
  kept, offset = [], 0
  while offset + 12 <= len(data):
    (length,) = struct.unpack_from("<Q", data, offset)
    end = offset + 12 + length + 4
    if end > len(data):
      break
    try:
      event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
      dropped = event.HasField("summary") and drop(event.step)
    except DecodeError:
      dropped = False  # Not ours to judge: TensorBoard reports a damaged record itself.
    if not dropped:
      kept.append(data[offset:end])
    offset = end
  new = b"".join(kept)
  if new != data:
    _replace(path, new)


class Throughput:
  """Steps/s, tokens/s, model TFLOP per step, TFLOP/s per device, MFU, data wait and ETA,
  over the steps since the last report, not counting the time spent off the steps
  (`excluded`: compiling, checkpointing, evaluating), which each report gives by kind."""

  # What the train loop does besides steps; each report row has `<kind>_s` for each.
  OFF_STEP_KINDS = ("compile", "checkpoint", "eval")

  def __init__(self, start_step: int, total_steps: int, tokens_per_step: int,
               flops_per_step: float, num_devices: int, peak_flops_per_device: float):
    self._total_steps = total_steps
    self._tokens_per_step = tokens_per_step
    self._flops_per_step = flops_per_step
    self._flops_per_device_step = flops_per_step / num_devices
    self._peak = peak_flops_per_device
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
    report = {
        "step_time_s": step_time,
        "steps_per_s": 1.0 / step_time,
        "tokens_per_s": self._tokens_per_step / step_time,
        "model_tflop_per_step": self._flops_per_step / 1e12,
        "tflops_per_device": self._flops_per_device_step / step_time / 1e12,
        "mfu": self._flops_per_device_step / step_time / self._peak,
        "data_wait_s": self._data_wait / steps,
        "eta_s": (self._total_steps - step) * step_time,
        **{f"{kind}_s": seconds for kind, seconds in self._excluded.items()},
    }
    self._last_step, self._last_time, self._data_wait = step, now, 0.0
    self._excluded = dict.fromkeys(self.OFF_STEP_KINDS, 0.0)
    return report
