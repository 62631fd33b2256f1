"""Progress of long work (an eval pass, a store build, a max-batch search), on stderr.

  with progress.Progress("eval validation", total=num_batches, unit="batches") as bar:
    for step in range(num_batches):
      ...
      bar.update()

On a terminal the line redraws in place, as a bar, and is erased when the work ends (the
work's own result line follows). Anywhere else (a log file, a pipe, CI) a plain line is
written at most every `INTERVAL_S` seconds, and once more at the end if the work took longer
than that:

  eval validation: 120/400 batches (30%), 12.3 s, ETA 28.7 s

Work that ends within `DELAY_S` seconds shows nothing, so tests and tiny runs stay as quiet as
before. Only process 0 of a multi-process run writes. `LINGVO_LITE_PROGRESS_INTERVAL_S`
sets the interval of plain lines for one command (`0`: a line at every update, from the
start; `inf`: none). A stream that can no longer be written (a closed pipe) ends the showing,
never the work.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import threading
import time
from typing import Any, Callable, TextIO

# Work that ends sooner shows nothing at all.
DELAY_S = 3.0
# Between two plain lines (not on a terminal); a log grows by a line a minute or two at most.
INTERVAL_S = 30.0
# Between two redraws of a terminal's bar: faster is flicker, not information.
REDRAW_S = 0.1
INTERVAL_ENV = "LINGVO_LITE_PROGRESS_INTERVAL_S"
_BAR_WIDTH = 20


def default_interval() -> float:
  """Seconds between plain lines: the environment's `LINGVO_LITE_PROGRESS_INTERVAL_S`, else
  `INTERVAL_S` (a value that is not a number is ignored)."""
  try:
    value = float(os.environ.get(INTERVAL_ENV, ""))
  except ValueError:
    return INTERVAL_S
  return value if value >= 0 else INTERVAL_S


def _duration(seconds: float) -> str:
  """12.3 s, 4m05s, 1h02m."""
  if seconds < 60:
    return f"{seconds:.1f} s"
  minutes, rest = divmod(int(round(seconds)), 60)
  if minutes < 60:
    return f"{minutes}m{rest:02d}s"
  return f"{minutes // 60}h{minutes % 60:02d}m"


def _counted(count: int, unit: str) -> str:
  """`1 compile`, `2 compiles`, `1 batch`: `unit` is the plural."""
  if count != 1 or not unit.endswith("s"):
    return f"{count:,} {unit}"
  return f"1 {unit[:-2] if unit.endswith(('ches', 'shes', 'sses', 'xes')) else unit[:-1]}"


def _is_terminal(stream: TextIO) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):  # No isatty, or a closed stream.
    return False


def _is_process_zero() -> bool:
  """True but in processes 1.. of a multi-process JAX run. Asked only where JAX is already
  imported, and without starting a backend (which would claim the accelerators)."""
  if "jax" not in sys.modules:
    return True
  try:
    from jax._src import distributed, xla_bridge  # pylint: disable=g-import-not-at-top
    if xla_bridge.backends_are_initialized():
      return sys.modules["jax"].process_index() == 0
    return not distributed.global_state.process_id
  except (ImportError, AttributeError):  # Another JAX version: show it everywhere.
    return True


class Progress:
  """Counts done units of one piece of work and shows them (see the module docstring).

  `update` may be called from one thread while another enters and leaves the block.

  Args:
    label: What the work is, first on the line: "eval validation".
    total: Units in the whole work, if known (then the line has a percentage and an ETA).
    unit: What a unit is, plural: "batches".
    stream: Where the lines go; stderr (as it is when the work starts) by default.
    interval: Seconds between plain lines; default `default_interval()`. 0 writes a line at
      each update made after the delay (one line per compile, say).
    clock: Seconds, monotonic; for tests.
    enabled: False shows nothing (a command's --no_progress).
  """

  def __init__(self, label: str, total: int | None = None, unit: str = "items", *,
               stream: TextIO | None = None, interval: float | None = None,
               clock: Callable[[], float] = time.monotonic, enabled: bool = True):
    self._label, self._total, self._unit = label, total, unit
    self._stream = stream if stream is not None else sys.stderr
    configured = default_interval()
    self._interval = configured if interval is None else interval
    # `LINGVO_LITE_PROGRESS_INTERVAL_S=0` shows even quick work, at once.
    self._delay = min(DELAY_S, configured)
    self._clock = clock
    self._enabled = enabled and _is_process_zero()
    self._terminal = _is_terminal(self._stream)
    self._lock = threading.Lock()
    self._count = 0
    self._detail = ""
    self._started = clock()
    self._last_shown = self._started  # The last plain line, or the last redraw.
    self._shown_state: tuple[int, str] | None = None  # What the last plain line said.
    self._drawn = False  # A bar is on the terminal's current line.

  def __enter__(self) -> "Progress":
    return self

  def __exit__(self, *unused: Any) -> None:
    self.close()

  def update(self, done: int = 1, detail: str = "") -> None:
    """Counts `done` more units (0 just refreshes the line); `detail` replaces the line's
    note after the counts ("per-device batch 24: fits")."""
    with self._lock:
      self._count += done
      if detail:
        self._detail = detail
      if not self._enabled:
        return
      now = self._clock()
      if now - self._started < self._delay:
        return
      if self._terminal:
        finished = self._total is not None and self._count >= self._total
        if self._drawn and now - self._last_shown < REDRAW_S and not finished:
          return
        self._draw(now)
      elif now - self._last_shown >= self._interval:
        self._write_line(now)

  def close(self) -> None:
    """Ends the work: erases the bar, or writes the last plain line if the work was long."""
    with self._lock:
      if not self._enabled:
        return
      if self._terminal:
        if self._drawn:
          self._write("\r\x1b[K")
          self._drawn = False
      else:
        now = self._clock()
        if (now - self._started > max(self._interval, self._delay)
            and self._shown_state != (self._count, self._detail)):
          self._write_line(now)
      self._enabled = False  # A second close (or a late update) shows nothing.

  def line(self, now: float | None = None) -> str:
    """The plain line for the counts so far."""
    elapsed = (self._clock() if now is None else now) - self._started
    parts = [f"{self._count:,}/{self._total:,} {self._unit}" if self._total is not None
             else _counted(self._count, self._unit)]
    if self._total:
      parts[0] += f" ({100 * self._count / self._total:.0f}%)"
    parts.append(_duration(elapsed))
    if self._total is not None and 0 < self._count < self._total:
      parts.append(f"ETA {_duration(elapsed / self._count * (self._total - self._count))}")
    text = f"{self._label}: {', '.join(parts)}"
    return f"{text}; {self._detail}" if self._detail else text

  def _write(self, text: str) -> None:
    try:
      self._stream.write(text)
      self._stream.flush()
    except (OSError, ValueError):  # A closed pipe or stream: progress is not worth a failure.
      self._enabled = False

  def _write_line(self, now: float) -> None:
    self._write(self.line(now) + "\n")
    self._last_shown = now
    self._shown_state = (self._count, self._detail)

  def _draw(self, now: float) -> None:
    text = self.line(now)
    if self._total:
      filled = min(_BAR_WIDTH, math.floor(_BAR_WIDTH * self._count / self._total))
      bar = "#" * filled + "." * (_BAR_WIDTH - filled)
      text = f"{self._label}: [{bar}] {text[len(self._label) + 2:]}"
    width = shutil.get_terminal_size(fallback=(80, 24)).columns - 1
    # Cut to the width: a wrapped line would not be redrawn by the carriage return.
    self._write(f"\r{text[:width]}\x1b[K")
    self._last_shown = now
    self._drawn = True
