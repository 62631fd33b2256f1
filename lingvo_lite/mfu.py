"""Model FLOPs utilization: analytic FLOPs per step, and each device's peak.

FLOPs per step, as the model's family counts them (models/family.py):
  6 x (matmul parameters) x tokens           forward + backward of every weight matmul,
                                             the unembedding included, the embedding lookup not;
  + 3 x (attention FLOPs per token) x tokens forward + backward of attention scores and values
                                             (for the transformer families 4 T H d per token
                                             and layer forward, halved for causality).
MaxText counts the same way but prints only TFLOP/s; this module turns it into MFU against
the device's peak: a datasheet table for accelerators (bf16 dense), and for CPUs the best of
10 float32 2048^3 matmuls (or a configured value). The measurement takes 2 s of a 2-core host,
a third of a short run's start, so it is kept beside JAX's compiled programs
(runtime/kept_results.py), keyed by the CPU model, the cores this process may use, the
devices JAX splits them into, XLA_FLAGS and the jax/jaxlib versions.

A peak is the best this host was seen to do, so a measurement taken while the host was busy
(other processes on its cores) must not stay the peak: the kept one is measured again after a
day and replaced only by a higher one, and a training step whose achieved FLOP/s beats it
raises it (`raised_peak`, kept too). MFU is achieved over peak, so it never reads above 100%.
Without a compilation cache folder each run measures it, and a raise lasts for the run.
"""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp

from lingvo_lite.models.family import LanguageModel
from lingvo_lite.runtime import kept_results, run_info

MEASURED = "best of 10 float32 2048^3 matmuls"
KEPT = MEASURED + ", measured by an earlier run on this host"
STEP = "a training step's own FLOP/s, faster than this host's measured matmul peak"
_KIND = "lingvo_lite_matmul_peaks"
KEPT_SECONDS = 86400

# Datasheet dense bf16 peak, TFLOP/s per device (per chip on TPU), by device_kind prefix.
PEAK_BF16_TFLOPS = {
    "TPU v4": 275.0,
    "TPU v5 lite": 197.0,  # v5e
    "TPU v5e": 197.0,
    "TPU v5p": 459.0,
    "TPU v5": 459.0,
    "TPU v6 lite": 918.0,  # v6e (Trillium)
    "TPU v6e": 918.0,
    "NVIDIA A100": 312.0,
    "NVIDIA H100": 989.0,
    "NVIDIA H200": 989.0,
}


def model_flops_per_step(model: LanguageModel, global_batch_size: int,
                         sequence_length: int) -> float:
  """Training FLOPs of one step: tokens x `model.train_flops_per_token(sequence_length)`,
  summed part by part (an integer attention count stays exact)."""
  tokens = global_batch_size * sequence_length
  attention = 3 * model.attention_flops_per_token(sequence_length) * tokens
  return 6.0 * model.matmul_parameters() * tokens + attention


@functools.lru_cache(maxsize=None)
def measured_matmul_peak(size: int = 2048, repeats: int = 10, dtype: str = "float32") -> float:
  """FLOP/s of the fastest of `repeats` size^3 matmuls of `dtype` on the first device."""
  a = jnp.ones((size, size), dtype)
  matmul = jax.jit(lambda x, y: x @ y)
  matmul(a, a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    started = time.perf_counter()
    matmul(a, a).block_until_ready()
    best = min(best, time.perf_counter() - started)
  return 2.0 * size ** 3 / best


def _cpu_model() -> str | None:
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      for line in f:
        if line.startswith("model name"):
          return line.partition(":")[2].strip()
  except OSError:
    pass
  return None


def _host_key() -> str:
  """What the host's peak depends on: the same CPU, cores, devices, flags and compiler."""
  return kept_results.digest({
      "cpu": _cpu_model(),
      "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count(),
      "devices": [jax.default_backend(), jax.local_device_count(),
                  jax.local_devices()[0].device_kind],
      "xla_flags": os.environ.get("XLA_FLAGS"),
      "versions": run_info.package_versions("jax", "jaxlib"),
  })


def _kept_peak(cache_folder: str | None, key: str) -> tuple[float, float, str] | None:
  """(the kept peak's FLOP/s, when the host was last measured, its source: KEPT or STEP), or
  None when nothing usable is kept."""
  kept = kept_results.read(cache_folder, _KIND, key) or {}
  flops, measured_at = kept.get("flops_per_second"), kept.get("measured_at")
  if not (isinstance(flops, (int, float)) and flops > 0
          and isinstance(measured_at, (int, float))):
    return None
  return float(flops), float(measured_at), STEP if kept.get("source") == "step" else KEPT


def _keep(cache_folder: str | None, key: str, flops: float, measured_at: float,
          source: str) -> None:
  kept_results.write(cache_folder, _KIND, key, {
      "flops_per_second": flops, "measured_at": measured_at,
      "source": "step" if source == STEP else "matmul"})


def host_matmul_peak(cache_folder: str | None) -> tuple[float, str]:
  """(this host's peak FLOP/s, where it comes from: MEASURED, KEPT or STEP): the kept one
  while the host was measured less than KEPT_SECONDS ago; else `measured_matmul_peak()` now,
  which replaces the kept one (under `cache_folder`; None: kept nowhere) only if higher."""
  key = _host_key()
  kept = _kept_peak(cache_folder, key)
  if kept is not None and 0 <= time.time() - kept[1] < KEPT_SECONDS:
    return kept[0], kept[2]
  measured = measured_matmul_peak()
  if kept is not None and kept[0] >= measured:  # Measured on a busier host: the best stays.
    _keep(cache_folder, key, kept[0], time.time(), kept[2])
    return kept[0], kept[2]
  _keep(cache_folder, key, measured, time.time(), MEASURED)
  return measured, MEASURED


def raised_peak(achieved: float, source: str, cache_folder: str | None) -> str:
  """A training step achieved `achieved` FLOP/s per device, above the peak from `source`:
  the peak is raised to it, since a peak is the best seen. A host's measured peak is kept
  raised under `cache_folder` for later runs; a configured or datasheet one is not (the
  step's FLOPs may count work the device does faster, int8 on a TPU say). Returns the raised
  peak's source."""
  if source not in (MEASURED, KEPT, STEP):
    return f"{source}, raised to a training step's own"
  key = _host_key()
  kept = _kept_peak(cache_folder, key)
  if kept is None or achieved > kept[0]:
    _keep(cache_folder, key, achieved, kept[1] if kept else time.time(), STEP)
  return STEP


def peak_flops_per_device(device: jax.Device, configured_tflops: float | None = None,
                          cache_folder: str | None = None) -> tuple[float, str]:
  """(FLOP/s, where the number comes from) for one device; a measured one is kept under
  `cache_folder` (see host_matmul_peak)."""
  if configured_tflops:
    return configured_tflops * 1e12, "configured"
  for prefix, tflops in PEAK_BF16_TFLOPS.items():
    if device.device_kind.startswith(prefix):
      return tflops * 1e12, f"{prefix} bf16 datasheet"
  return host_matmul_peak(cache_folder)
