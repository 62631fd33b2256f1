"""What a compiled program allocates in the device's own memory, from XLA's buffer assignment.

XLA places each buffer of a compiled program in a memory space ("color"): 0 is the device's
memory (a TPU's HBM), 5 the host's pinned memory (`S(5)` in an HLO layout: JAX's
"pinned_host", where a remat policy's offloaded activations and an offloaded optimizer state
live). XLA:TPU's `peak_memory_in_bytes` is not the device's alone: a MaxText128B step that
offloads its q/k/v stacks (12 GiB in host memory) reported a peak of its arguments plus those
12 GiB, while its buffer assignment allocated 13.99 GiB in HBM and XLA:TPU compiled it under
its 15.75 GiB limit (bench/results/2026-12-08/maxtext128b/README.md). The assignment's
allocations in space 0 are what the chip holds: the entry's parameters, the outputs that do
not reuse a donated parameter, the constants, and one block of temporaries packed by XLA's
heap simulation (its size is their peak).

XLA:TPU sends no serialized assignment with its memory analysis
(`serialized_buffer_assignment_proto` is empty), so the compile asks XLA to write its
assignment as text (`xla_dump_to`, a per-compile debug option that leaves the program as it
is) into a folder of its own, reads it and removes the folder. Where XLA_FLAGS already dump
(`--xla_dump_to=DIR`), that dump is read instead and left where the user asked for it.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shlex
import tempfile
import time
from typing import Any

DEVICE_SPACE = 0  # The device's own memory (HBM).
HOST_SPACE = 5  # Pinned host memory: `S(5)` in an HLO layout.

# "allocation 3: size 469762048, parameter 10, shape |f32[64,3584,512]| ..., color 5, ...:"
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)(.*)$", re.MULTILINE)
_COLOR = re.compile(r"\bcolor (\d+)")
_DUMP_TO = re.compile(r"^--xla_dump_to=(.+)$")
_ASSIGNMENT_FILE = "*after_optimizations-buffer-assignment.txt"


@dataclasses.dataclass(frozen=True)
class Allocation:
  """One buffer allocation: its bytes, memory space, and whether it is an entry parameter or
  thread-local (a kernel's scalar in its own scratch)."""

  size: int
  color: int = DEVICE_SPACE
  parameter: bool = False
  thread_local: bool = False


def allocations(text: str) -> list[Allocation]:
  """The allocations of XLA's buffer assignment as it writes it (`BufferAssignment::ToString`:
  one `allocation N: size S, ...` line each; no color named is memory space 0)."""
  found = []
  for match in _ALLOCATION.finditer(text):
    attributes = match.group(2)
    color = _COLOR.search(attributes)
    found.append(Allocation(size=int(match.group(1)),
                            color=int(color.group(1)) if color else DEVICE_SPACE,
                            parameter=", parameter " in attributes,
                            thread_local="thread-local" in attributes))
  return found


def device_bytes(text: str) -> int | None:
  """The bytes the program allocates in the device's memory (space 0), or None where the text
  holds no allocation. Thread-local allocations are a kernel's scalars in its own scratch,
  not the device's memory (a few bytes each)."""
  found = allocations(text)
  if not found:
    return None
  return sum(a.size for a in found if a.color == DEVICE_SPACE and not a.thread_local)


def _flags_dump_folder() -> str | None:
  """The folder XLA_FLAGS dump into (`--xla_dump_to=DIR`), or None."""
  for flag in shlex.split(os.environ.get("XLA_FLAGS", "")):
    match = _DUMP_TO.match(flag)
    if match:
      return match.group(1)
  return None


def _newest_assignment(folder: str, since: float) -> str | None:
  """The text of the newest buffer assignment written into `folder` from `since` on."""
  written = [(os.path.getmtime(p), p) for p in glob.glob(os.path.join(folder, _ASSIGNMENT_FILE))
             if os.path.getmtime(p) >= since]
  if not written:
    return None
  with open(max(written)[1], encoding="utf-8", errors="replace") as f:
    return f.read()


def compile_with_device_bytes(lowered: Any) -> tuple[Any, int | None]:
  """`lowered.compile()`, and what its buffer assignment allocates in the device's memory
  (None where XLA wrote none: a module XLA_FLAGS' own dump leaves out)."""
  folder = _flags_dump_folder()
  if folder is not None:
    started = time.time() - 1  # File times are coarser than the clock on some filesystems.
    executable = lowered.compile()
    text = _newest_assignment(folder, started)
  else:
    with tempfile.TemporaryDirectory(prefix="lingvo_lite_assignment_") as own:
      executable = lowered.compile(compiler_options={"xla_dump_to": own})
      text = _newest_assignment(own, 0.0)
  return executable, None if text is None else device_bytes(text)
