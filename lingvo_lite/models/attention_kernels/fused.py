"""jax.nn.dot_product_attention's kernels: "xla" (XLA's fused attention, any platform) and
"cudnn" (cuDNN's flash attention, NVIDIA GPUs).

Causal is a flag without segments (the kernel skips the masked blocks), segments a mask, and a
window the kernel's own local window. They take no sinks (a call with gpt-oss's goes to the
written-out row) and have no decode form (a decode step is the written-out one). Neither is
counted as holding the scores: XLA or cuDNN may fuse them away.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from lingvo_lite.models.attention_kernels.einsum import attention_mask
from lingvo_lite.models.attention_kernels.row import PLATFORMS, Call, Kernel

# Heads "auto" gives cuDNN: those every NVIDIA GPU takes (a Hopper takes up to 256 when named).
_AUTO_WIDEST_HEAD = 128


def attend(layer: Any, q: jax.Array, k: jax.Array, v: jax.Array,
           segment_ids: jax.Array | None, sinks: jax.Array | None = None, *,
           implementation: str) -> jax.Array:
  """jax.nn.dot_product_attention with `implementation` (the rows' `attend`, bound to theirs)."""
  del sinks  # Not in the rows' masks: a call with sinks never comes here.
  mask = None if segment_ids is None else attention_mask(segment_ids, q.shape[1])[:, :, 0]
  window = layer.sliding_window()
  return jax.nn.dot_product_attention(
      q, k, v, mask=mask, is_causal=mask is None, scale=layer.scale(),
      local_window_size=None if window is None else (window - 1, 0),
      implementation=implementation)


def _widest_cudnn_head(call: Call) -> int:
  """Hopper (compute capability 9.0) and newer take heads up to 256 wide, older GPUs 128."""
  return 256 if float(call.compute_capability or 0) >= 9.0 else 128


def cudnn_refusal(call: Call) -> str | None:
  """What cuDNN's kernel refuses, before any device time."""
  if call.platform != "gpu" or "NVIDIA" not in call.device_kind.upper():
    return f"needs an NVIDIA GPU (this device: {call.device_kind or call.platform})"
  if call.dtype not in ("bfloat16", "float16"):
    return f"needs {call.path}.dtype 'bfloat16' or 'float16' (got {call.dtype!r})"
  widest = _widest_cudnn_head(call)
  if call.head_dim % 8 or call.head_dim > widest:
    return (f"needs a head_dim that is a multiple of 8 and at most {widest} on "
            f"{call.device_kind} (got {call.head_dim})")
  return None


def _cudnn_auto_refusal(call: Call) -> str | None:
  if call.head_dim > _AUTO_WIDEST_HEAD:
    return (f"is picked for heads up to {_AUTO_WIDEST_HEAD} wide (got {call.head_dim}; name "
            "it to use it)")
  return None


_MASKS = frozenset({"segments", "window"})

XLA = Kernel(
    name="xla",
    description="jax.nn.dot_product_attention's XLA attention (any platform; no sinks, no "
                "decode form)",
    platforms=PLATFORMS, auto_on=("gpu",), masks=_MASKS, holds_scores=False,
    attend=functools.partial(attend, implementation="xla"))

CUDNN = Kernel(
    name="cudnn",
    description="cuDNN's flash attention through jax.nn.dot_product_attention (NVIDIA GPUs, "
                "bfloat16 or float16, heads a multiple of 8 up to 128, 256 on Hopper; no "
                "sinks, no decode form)",
    platforms=("gpu",), auto_on=("gpu",), masks=_MASKS, holds_scores=False,
    attend=functools.partial(attend, implementation="cudnn"), refusal=cudnn_refusal,
    auto_refusal=_cudnn_auto_refusal)
