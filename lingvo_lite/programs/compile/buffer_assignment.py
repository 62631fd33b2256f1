"""What a compiled program allocates in the device's own memory, from XLA's buffer assignment.

XLA places each buffer of a compiled program in a memory space ("color"): 0 is the device's
memory (a TPU's HBM), 5 the host's pinned memory (`S(5)` in an HLO layout: JAX's
"pinned_host", where a remat policy's offloaded activations and an offloaded optimizer state
live). XLA:TPU's `peak_memory_in_bytes` is not the device's alone: a MaxText128B step that
offloads its q/k/v stacks (12 GiB in host memory) reported a peak of the arguments plus those
12 GiB, while its buffer assignment allocated 13.99 GiB in HBM and XLA:TPU compiled it under
its 15.75 GiB limit (bench/results/2026-12-08/maxtext128b/README.md). The assignment's
allocations in space 0 are what the chip holds: the entry's parameters, the outputs that do
not reuse a donated parameter, the constants, and one block of temporaries packed by XLA's
heap simulation (its size is their peak).

The assignment comes serialized (`CompiledMemoryStats.serialized_buffer_assignment_proto`,
xla/service/hlo.proto's BufferAssignmentProto); the few fields read here are decoded from
protobuf's wire format, so no XLA proto module is imported.
"""

from __future__ import annotations

import dataclasses

DEVICE_SPACE = 0  # The device's own memory (HBM).
HOST_SPACE = 5  # Pinned host memory: `S(5)` in an HLO layout.

# BufferAssignmentProto.buffer_allocations, and BufferAllocationProto's fields read here.
_ALLOCATIONS = 3
_SIZE, _THREAD_LOCAL, _PARAMETER, _COLOR = 2, 3, 5, 8
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


@dataclasses.dataclass(frozen=True)
class Allocation:
  """One buffer allocation: its bytes, memory space, and whether it is an entry parameter or
  thread-local (a scalar a kernel keeps in its own scratch)."""

  size: int
  color: int = 0
  parameter: bool = False
  thread_local: bool = False


def _varint(data: bytes, at: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    byte = data[at]
    at += 1
    value |= (byte & 0x7F) << shift
    if byte < 0x80:
      return value, at
    shift += 7


def _fields(data: bytes):
  """(field number, wire type, value) of one message: an int, or the bytes of a
  length-delimited field."""
  at = 0
  while at < len(data):
    key, at = _varint(data, at)
    number, wire = key >> 3, key & 7
    if wire == _VARINT:
      value, at = _varint(data, at)
    elif wire == _LENGTH:
      length, at = _varint(data, at)
      value, at = data[at:at + length], at + length
    elif wire in (_FIXED64, _FIXED32):
      width = 8 if wire == _FIXED64 else 4
      value, at = int.from_bytes(data[at:at + width], "little"), at + width
    else:
      raise ValueError(f"wire type {wire} of field {number}: not one protobuf writes")
    yield number, wire, value


def allocations(serialized: bytes) -> list[Allocation]:
  """The allocations of a serialized BufferAssignmentProto."""
  found = []
  for number, wire, value in _fields(serialized):
    if number != _ALLOCATIONS or wire != _LENGTH:
      continue
    read = {n: v for n, w, v in _fields(value) if w == _VARINT}
    found.append(Allocation(size=read.get(_SIZE, 0), color=read.get(_COLOR, 0),
                            parameter=bool(read.get(_PARAMETER, 0)),
                            thread_local=bool(read.get(_THREAD_LOCAL, 0))))
  return found


def device_bytes(serialized: bytes | None) -> int | None:
  """The bytes the program allocates in the device's memory (space 0), or None where no
  assignment came back (an older jaxlib, a backend that sends none) or it cannot be read."""
  if not serialized:
    return None
  try:
    found = allocations(bytes(serialized))
  except (IndexError, ValueError):
    return None
  # Thread-local allocations are a kernel's scalars in its own scratch, not the device's
  # memory (a few bytes each).
  total = sum(a.size for a in found if a.color == DEVICE_SPACE and not a.thread_local)
  return total or None
