"""What a store build shows while it runs: progress over its finished shards, and where the
pipeline's own log lines go (a file beside the store, so the terminal gets only the progress,
the one-line error and the summary). data/store_build.py runs the build."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import uuid

from etils import epath

from lingvo_lite import paths
from lingvo_lite.runtime import progress


@contextlib.contextmanager
def worker_logs_to(log_file: str):
  """Points file descriptor 2 at `log_file` while the pipeline runs, and yields a stream on
  the real stderr. Beam's worker processes inherit descriptor 2 and log their start-up, their
  options and TensorFlow's CUDA probe there: pages of lines that are not the user's business.
  What is (progress, the one-line error, the summary) goes to the yielded stream."""
  sys.stderr.flush()
  saved = os.dup(2)
  stream = os.fdopen(os.dup(saved), "w", buffering=1)
  try:
    with open(log_file, "w") as log:
      os.dup2(log.fileno(), 2)
      yield stream
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    stream.close()


class ShardProgress:
  """Progress over finished shards (ledger entries), polled while the pipeline runs: a bar on
  a terminal, a line now and then in a log (lingvo_lite.runtime.progress)."""

  def __init__(self, partial: epath.Path, total: int, label: str, enabled: bool, stream):
    self._partial, self._total, self._label, self._stream = partial, total, label, stream
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._poll, daemon=True) if enabled else None

  def __enter__(self):
    if self._thread:
      self._thread.start()
    return self

  def __exit__(self, *unused):
    self._stop.set()
    if self._thread:
      self._thread.join()

  def _poll(self):
    with progress.Progress(self._label, total=self._total, unit="shards",
                           stream=self._stream) as bar:
      shown = 0
      while True:
        stopped = self._stop.is_set()  # Then this count is the last, and complete.
        done = len(list((self._partial / "ledger").glob("*.json"))) if (
            self._partial / "ledger").exists() else 0
        bar.update(done - shown)  # 0 still redraws: the seconds go on.
        shown = done
        if stopped:
          return
        self._stop.wait(0.5)


def build_log(path: epath.Path) -> str:
  """A local file for the pipeline's own log lines, beside the store (or in /tmp)."""
  if paths.is_remote(os.fspath(path)):
    return os.path.join(tempfile.gettempdir(), f"lingvo_lite-build-{uuid.uuid4().hex[:8]}.log")
  return os.fspath(path.parent / f".{path.name}.build.log")
