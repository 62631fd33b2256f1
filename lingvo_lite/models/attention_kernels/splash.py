"""The TPU's flash attention: Pallas's splash kernel (models/flash_attention.py, per shard).

It takes every mask (causal, segments, a window as the kernel's band, gpt-oss's sinks) and
never writes the scores out; its blocks must divide the length (a short prefill bucket they
do not divide is written out). Its decode step is the written-out form's ("einsum"): on the
chip it beat the paged decode kernel at 8 and 64 slots and equalled it at one (README,
"Measured on a TPU v5e": 4.5 against 13.6 ms a step at 64 slots of heads of 128); "paged"
stays a row to name.
Off a TPU it runs in Pallas's interpret mode (slow, exact: what the CPU tests compare); a GPU
cannot run it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from lingvo_lite.models import flash_attention
from lingvo_lite.models.attention_kernels.row import Kernel


def attend(layer: Any, q: jax.Array, k: jax.Array, v: jax.Array,
           segment_ids: jax.Array | None, sinks: jax.Array | None = None) -> jax.Array:
  """The splash kernel over the layer's queries, scaled first (the kernel scales nothing)."""
  q = q * jnp.asarray(layer.scale(), layer.dtype)
  return flash_attention.splash_attention(q, k, v, segment_ids, layer.sliding_window(),
                                          sinks=sinks)


ROW = Kernel(
    name="splash",
    description="Pallas's splash flash-attention kernel for TPUs (any mask; lengths its "
                "blocks of 512, 256 or 128 (1024 for heads of 64) divide; decodes written out)",
    platforms=("tpu",), interpreted_on=("cpu",), auto_on=("tpu",), holds_scores=False,
    attend=attend, takes_length=flash_attention.supports_length, decode_fallback="einsum",
    value_width=True)
