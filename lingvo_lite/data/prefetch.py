"""Builds host batches on a background thread so the accelerator does not wait for NumPy."""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterator

from lingvo_lite.data.source import Batch, DataSource

_DONE = object()


class Prefetcher:
  """Yields (step, local batch) for steps [start, stop), `depth` batches ahead.

  `wait_seconds` accumulates how long the consumer blocked on the queue: the data wait.
  """

  def __init__(self, source: DataSource, start: int, stop: int, process_index: int = 0,
               process_count: int = 1, depth: int = 2):
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._stop_event = threading.Event()
    self.wait_seconds = 0.0

    def produce():
      try:
        for step in range(start, stop):
          batch = source.batch(step, process_index, process_count)
          while not self._stop_event.is_set():
            try:
              self._queue.put((step, batch), timeout=0.1)
              break
            except queue.Full:
              continue
          if self._stop_event.is_set():
            return
        self._queue.put(_DONE)
      except BaseException as e:  # Surfaced in the consumer's thread.
        self._queue.put(e)

    self._thread = threading.Thread(target=produce, daemon=True, name="prefetch")
    self._thread.start()

  def __iter__(self) -> Iterator[tuple[int, Batch]]:
    while True:
      started = time.perf_counter()
      item = self._queue.get()
      self.wait_seconds += time.perf_counter() - started
      if item is _DONE:
        return
      if isinstance(item, BaseException):
        raise item
      yield item

  def close(self) -> None:
    self._stop_event.set()
