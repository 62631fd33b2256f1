"""The watchdog of a training run: stack dumps when no train step finishes for too long.

  --fdl.watchdog.enabled=True --fdl.watchdog.min_stall_seconds=120
  --fdl.watchdog.interval_seconds=600        # also a dump every 10 minutes

A hung collective (a peer stuck in its input pipeline, a deadlock in a host callback) shows
as a process that stops without a word. When no step has finished for `stall_multiple` x the
median step time, and at least `min_stall_seconds`, the watchdog writes every thread's stack
(`stack_dumps.py`) to `JOB/stacks/<host>-<pid>-<time>.txt` and says so in one warning line:
one dump per stall, the next only after a step finished again. Compiling, restoring,
evaluating and checkpointing are `excused`: their time is no stall. Every process of a
multi-process run watches itself; nothing here talks to the other processes, which may be
the ones that hang.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import statistics
import sys
import threading
import time
from typing import Annotated, Callable, Iterator

from etils import epath

from lingvo_lite.fields import PositiveFloat, Range
from lingvo_lite.runtime import stack_dumps

# Step intervals the median is taken over: recent enough to follow a change of speed.
_WINDOW = 100
AtLeastOne = Annotated[float, Range(1, note="a step as slow as the median is no stall")]


@dataclasses.dataclass(frozen=True)
class WatchdogSettings:
  """When a training run writes the stacks of all its threads (to JOB/stacks/).

  Attributes:
    enabled: Watch for stalls: no train step finished for stall_multiple x the median step
      time, and at least min_stall_seconds. None: on in multi-process runs
      (jax.process_count() > 1), where a hang in one process stops them all.
    stall_multiple: A stall lasts this many median step times (the median of the most
      recent 100 intervals between finished steps).
    min_stall_seconds: A stall lasts at least this long; before any step time is known, this
      alone is the limit.
    interval_seconds: Also write a dump every this many seconds, stalled or not (MaxText's
      stack_trace_interval_seconds); 0 turns periodic dumps off. Works with enabled=False.
  """

  enabled: bool | None = None
  stall_multiple: AtLeastOne = 10.0
  min_stall_seconds: PositiveFloat = 300.0
  interval_seconds: Annotated[float, Range(0, note="0 turns periodic dumps off")] = 0.0

  def watches(self, process_count: int) -> bool:
    return self.enabled if self.enabled is not None else process_count > 1

  def stall_limit(self, median_step_seconds: float | None) -> float:
    """Seconds without a finished step that make a stall."""
    if median_step_seconds is None:
      return self.min_stall_seconds
    return max(self.min_stall_seconds, self.stall_multiple * median_step_seconds)


class Watchdog:
  """Watches the train loop from a daemon thread; see the module docstring.

  The loop calls `step_done()` after each train step's call returns. That call returns
  once the step is dispatched, not done: JAX runs steps asynchronously, and XLA's queue of
  dispatched computations is bounded, so dispatch waits for earlier steps and a device that
  stops makes dispatch stop too within a few steps. The loop also waits for the device at
  every log step. Intervals measured at dispatch can be near 0 between such waits, which
  makes the median small and the floor (`min_stall_seconds`) the limit: lenient, never
  falsely alarmed.

  Args:
    settings: The config part.
    folder: Where the dumps go (`JOB/stacks`).
    process_count: Processes in the run (for `settings.enabled=None`).
    poll_seconds: How often the thread looks.
    clock: Monotonic seconds (tests pass a fake one).
  """

  def __init__(self, settings: WatchdogSettings, folder: epath.Path | str, process_count: int,
               poll_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic):
    self.settings = settings
    self.folder = epath.Path(folder)
    self._watching = settings.watches(process_count)
    self._poll_seconds = poll_seconds
    self._clock = clock
    self._lock = threading.Lock()
    self._closed = threading.Event()
    self._thread: threading.Thread | None = None
    self._intervals: collections.deque[float] = collections.deque(maxlen=_WINDOW)
    self._last_progress = clock()  # The last finished step, or the end of an excused span.
    self._last_step: float | None = None  # The last finished step, if nothing excused since.
    self._excused: list[str] = []  # What runs now that is excused, innermost last.
    self._dumped_this_stall = False
    self._next_periodic = self._last_progress + settings.interval_seconds
    self.dumps: list[str] = []  # Where each dump went (for tests and messages).

  @property
  def active(self) -> bool:
    return self._watching or self.settings.interval_seconds > 0

  def start(self) -> "Watchdog":
    if self.active and self._thread is None:
      with self._lock:
        self._last_progress = self._clock()
        self._next_periodic = self._last_progress + self.settings.interval_seconds
      self._thread = threading.Thread(target=self._run, name="lingvo_lite-watchdog",
                                      daemon=True)
      self._thread.start()
    return self

  def close(self) -> None:
    self._closed.set()
    if self._thread is not None:
      self._thread.join(timeout=self._poll_seconds + 1)  # A dump in progress may outlast it.

  def __enter__(self) -> "Watchdog":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.close()

  def step_done(self) -> None:
    now = self._clock()
    with self._lock:
      if self._last_step is not None:
        self._intervals.append(now - self._last_step)
      self._last_step = self._last_progress = now
      self._dumped_this_stall = False

  @contextlib.contextmanager
  def excused(self, what: str) -> Iterator[None]:
    """Time inside (a compile, a restore, an evaluation, a checkpoint) is no stall; the clock
    starts again when it ends. May nest."""
    with self._lock:
      self._excused.append(what)
    try:
      yield
    finally:
      with self._lock:
        self._excused.remove(what)
        self._last_progress = self._clock()
        self._last_step = None  # The next interval would hold part of this span.

  def median_step_seconds(self) -> float | None:
    with self._lock:
      return statistics.median(self._intervals) if self._intervals else None

  def stall_limit(self) -> float:
    return self.settings.stall_limit(self.median_step_seconds())

  def _run(self) -> None:
    while not self._closed.wait(self._poll_seconds):
      try:
        self.check()
      except Exception as e:  # pylint: disable=broad-except
        stack_dumps.warn(f"the watchdog stopped: {type(e).__name__}: {e}")
        return

  def check(self) -> None:
    """One look: a dump if a stall began or a periodic dump is due (the thread calls it)."""
    median = self.median_step_seconds()
    limit = self.settings.stall_limit(median)
    now = self._clock()
    with self._lock:
      idle = now - self._last_progress
      stalled = (self._watching and not self._excused and not self._dumped_this_stall
                 and idle >= limit)
      self._dumped_this_stall = self._dumped_this_stall or stalled
      periodic = self.settings.interval_seconds > 0 and now >= self._next_periodic
      if periodic:
        self._next_periodic = now + self.settings.interval_seconds
      during = f" (during: {self._excused[-1]})" if self._excused else ""
    if stalled:
      floor = _seconds(self.settings.min_stall_seconds)
      why = (f"{self.settings.stall_multiple:g} x the median step time {_seconds(median)} s, "
             f"at least {floor} s" if median is not None else
             f"no step time known yet: the floor, {floor} s")
      where = self._dump(f"watchdog: no train step finished in {_seconds(idle)} s ({why})")
      stack_dumps.warn(f"no train step finished in {_seconds(idle)} s ({why}); stacks of every "
                       f"thread written to {where}")
    elif periodic:  # A stall's dump serves as the periodic one too.
      where = self._dump(f"watchdog: periodic, every {self.settings.interval_seconds:g} s "
                         f"(watchdog.interval_seconds){during}")
      print(f"lingvo_lite: periodic stack dump (watchdog.interval_seconds="
            f"{self.settings.interval_seconds:g}) written to {where}", file=sys.stderr,
            flush=True)

  def _dump(self, reason: str) -> str:
    where = stack_dumps.dump_or_print(self.folder, reason)
    self.dumps.append(where)
    return where


def _seconds(value: float) -> str:
  """123 for minutes of stall, 1.2 or 0.00031 for a step: three digits at most."""
  return f"{value:.0f}" if value >= 100 else f"{value:.3g}"
