"""Where metrics go: JSON lines, TensorBoard (through clu), and a progress line on stdout.

Only process 0 writes. TensorBoard summaries need clu's TensorFlow writer; where TensorFlow
is missing (the synthetic-data path on an accelerator host) they are skipped with a note and
the JSON lines remain.
"""

from __future__ import annotations

import json
import math
import time
from typing import Mapping

from etils import epath

from lingvo_lite.data.tensorflow_import import import_tensorflow


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
  """Appends `{"step": ..., **metrics}` to a JSONL file and mirrors scalars to TensorBoard."""

  def __init__(self, jsonl_path: epath.Path, tensorboard_dir: epath.Path | None,
               enabled: bool = True):
    self._enabled = enabled
    self._jsonl_path = jsonl_path
    self._tensorboard = None
    if not enabled:
      return
    jsonl_path.parent.mkdir(parents=True, exist_ok=True)
    if tensorboard_dir is not None:
      try:
        import_tensorflow()
        from clu import metric_writers  # pylint: disable=g-import-not-at-top
        self._tensorboard = metric_writers.SummaryWriter(str(tensorboard_dir))
      except ImportError as e:
        log(f"TensorBoard summaries disabled ({e}); metrics still go to {jsonl_path}")

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    if not self._enabled:
      return
    record = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
    with self._jsonl_path.open("a") as f:
      f.write(json.dumps(record) + "\n")
    if self._tensorboard is not None:
      self._tensorboard.write_scalars(int(step), {k: v for k, v in metrics.items()})

  def close(self) -> None:
    if self._tensorboard is not None:
      self._tensorboard.flush()
      self._tensorboard.close()


class Throughput:
  """Steps/s, tokens/s, model TFLOP per step, TFLOP/s per device, MFU, data wait and ETA,
  over the steps since the last report."""

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

  def add_data_wait(self, seconds: float) -> None:
    self._data_wait += seconds

  def report(self, step: int) -> dict[str, float]:
    now = time.perf_counter()
    steps = max(step - self._last_step, 1)
    elapsed = max(now - self._last_time, 1e-9)
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
    }
    self._last_step, self._last_time, self._data_wait = step, now, 0.0
    return report
