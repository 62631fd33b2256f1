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
a third of a short run's start, so it is kept beside JAX's compiled programs for a day
(runtime/kept_results.py), keyed by the CPU model, the cores this process may use, the
devices JAX splits them into, XLA_FLAGS and the jax/jaxlib versions; a day, so that one
measurement taken while the host was busy does not stay. Without a compilation cache folder
each run measures it.
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


def host_matmul_peak(cache_folder: str | None) -> tuple[float, bool]:
  """(FLOP/s of `measured_matmul_peak()` on this host, whether an earlier run measured it):
  kept under `cache_folder` for KEPT_SECONDS (None: measured now, kept nowhere)."""
  key = kept_results.digest({
      "cpu": _cpu_model(),
      "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count(),
      "devices": [jax.default_backend(), jax.local_device_count(),
                  jax.local_devices()[0].device_kind],
      "xla_flags": os.environ.get("XLA_FLAGS"),
      "versions": run_info.package_versions("jax", "jaxlib"),
  })
  kept = kept_results.read(cache_folder, _KIND, key) or {}
  flops, measured_at = kept.get("flops_per_second"), kept.get("measured_at")
  if (isinstance(flops, (int, float)) and flops > 0 and isinstance(measured_at, (int, float))
      and 0 <= time.time() - measured_at < KEPT_SECONDS):
    return float(flops), True
  flops = measured_matmul_peak()
  kept_results.write(cache_folder, _KIND, key, {"flops_per_second": flops,
                                                "measured_at": time.time()})
  return flops, False


def peak_flops_per_device(device: jax.Device, configured_tflops: float | None = None,
                          cache_folder: str | None = None) -> tuple[float, str]:
  """(FLOP/s, where the number comes from) for one device; a measured one is kept under
  `cache_folder` (see host_matmul_peak)."""
  if configured_tflops:
    return configured_tflops * 1e12, "configured"
  for prefix, tflops in PEAK_BF16_TFLOPS.items():
    if device.device_kind.startswith(prefix):
      return tflops * 1e12, f"{prefix} bf16 datasheet"
  flops, kept = host_matmul_peak(cache_folder)
  return flops, KEPT if kept else MEASURED
