"""Latent attention's decode step: every query head over one cache of compressed latents and
rotary keys (DeepSeek's multi-head latent attention, models/latent_attention.py).

The cache ("latent" layout) holds per token the normalized latent c [kv_lora_rank] and the
rotated key k_rope [qk_rope_head_dim], shared by all heads. The layer absorbs the key's up
projection into its queries (q_nope W_uk, a query in latent space) before the step and the
value's up projection into its output after it, so the step is multi-query attention whose
key is [c, k_rope] and whose value is c: scores q_latent . c + q_rope . k_rope, the weighted
sum of latents. Nothing per head is cached or expanded.

A decode form only (training and prefill attend in the expanded form through the other rows);
written out, on every platform: a decode step of any kernel finds it by its layout
(`attention_kernels.for_decoding`), and "auto" never picks it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lingvo_lite.models.attention_kernels.einsum import unnormalized_softmax
from lingvo_lite.models.attention_kernels.row import PLATFORMS, DecodeForm, DecodeStep, Kernel
from lingvo_lite.target import current_platform

LAYOUT = "latent"


def attend_cached(step: DecodeStep) -> jax.Array:
  """softmax(q_latent c^T + q_rope k_rope^T) c over the entries each query sees (the layer's
  `_cache_mask`).

  `step.q`: [batch, length, heads, kv_lora_rank + qk_rope_head_dim], scaled, the latent query
  before the rotary one; `step.cache`: (latents [batch, 1, entries, kv_lora_rank], rotary keys
  [batch, 1, entries, qk_rope_head_dim]). Returns [batch, length, heads, kv_lora_rank].
  """
  layer, q = step.layer, step.q
  latents, rope_keys = step.cache
  rank = latents.shape[-1]
  # XLA:CPU has no bfloat16 x bfloat16 -> float32 dot of these shapes (as the einsum row).
  operands = jnp.float32 if current_platform() == "cpu" else layer.dtype
  keys = jnp.concatenate([latents, rope_keys], axis=-1)[:, 0].astype(operands)
  logits = jnp.einsum("bthc,bsc->bhts", q.astype(operands), keys,
                      preferred_element_type=jnp.float32)
  mask = layer._cache_mask(step.positions, keys.shape[-2])  # pylint: disable=protected-access
  weights, denominator = unnormalized_softmax(logits, mask[:, None])
  out = jnp.einsum("bhts,bsc->bthc", weights.astype(operands), keys[..., :rank],
                   preferred_element_type=jnp.float32)
  return (out / jnp.moveaxis(denominator, -1, 1)[..., None]).astype(layer.dtype)


ROW = Kernel(
    name="latent",
    description="latent attention's decode step over a cache of compressed latents and "
                "rotary keys (any platform; no training form)",
    platforms=PLATFORMS, auto_on=(), holds_scores=True,
    decode=DecodeForm(layouts=(LAYOUT,), attend=attend_cached), decode_fallback=None)
