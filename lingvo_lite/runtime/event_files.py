"""TensorBoard event files, written here: TFRecords of TensorBoard's Event protos.

TensorBoard's own writer's file layer is TensorFlow's wherever TensorFlow is installed, and
importing TensorFlow takes 5 to 15 s, longer than a small run's training; so `ScalarEvents`
writes the records itself (framing and CRC-32C as TFRecord has them), and `drop_events`
rewrites a file without some steps' summaries (a resumed run's commit). Each metric is a plain
scalar (`simple_value`), the kind TensorBoard's standard readers list
(`EventAccumulator.Scalars`); TensorFlow's summary ops, which clu's writer uses, store scalars
as tensors that those readers do not see.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import struct
import time
from typing import Callable, Mapping

from etils import epath

from lingvo_lite import file_writes


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
    self.length = 0  # Bytes written and flushed: the end of the last whole event.
    with file_writes.writing(self.path):
      self._file = self.path.open("wb")
    try:
      self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
    except OSError:
      with contextlib.suppress(OSError):  # Its flush fails again; the file goes all the same.
        self._file.close()
      self.path.unlink(missing_ok=True)  # A file without its header is nobody's.
      raise

  @staticmethod
  def prepare() -> None:
    """Imports what the first event file needs, so the first metric row costs no import.
    Raises ImportError where TensorBoard is not installed."""
    # pylint: disable-next=g-import-not-at-top,unused-import
    from tensorboard.compat.proto import event_pb2, summary_pb2

  def _write(self, event) -> None:
    record = tfrecord(event.SerializeToString())
    with file_writes.writing(self.path):
      self._file.write(record)
      self._file.flush()
    self.length += len(record)

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    values = [self._summary_pb2.Summary.Value(tag=tag, simple_value=value)
              for tag, value in scalars.items()]
    self._write(self._event_pb2.Event(
        wall_time=time.time(), step=int(step), summary=self._summary_pb2.Summary(value=values)))

  def flush(self) -> None:
    with file_writes.writing(self.path):
      self._file.flush()

  def close(self) -> None:
    """Closes the file (also after a failed write, whose flush fails again: it is raised)."""
    with file_writes.writing(self.path):
      self._file.close()




_FLOAT32_MAX = 3.4028234663852886e38


def float32(value: float) -> float:
  """A scalar TensorBoard can store: its summaries are float32, and TensorFlow refuses a
  larger number (a diverged model's perplexity of 1e300) rather than round it to inf. The JSON
  lines keep the value itself."""
  value = float(value)
  return math.copysign(math.inf, value) if abs(value) > _FLOAT32_MAX else value


def is_events(path: epath.Path) -> bool:
  return "tfevents" in path.name and not path.name.startswith(".")


def drop_events(path: epath.Path, drop: Callable[[int], bool]) -> None:
  """Rewrites an event file without its summaries whose step `drop`s (other events stay): cut
  in place where they are its last records (file_writes.shrink).

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
  file_writes.shrink(path, data, b"".join(kept))
