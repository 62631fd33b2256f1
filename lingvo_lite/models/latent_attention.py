"""Multi-head latent attention (MLA; DeepSeek-V2, V3, Kimi K2): keys and values made from one
compressed latent per token, which is all a decode cache holds.

Per token x [dim]:

- queries: x W_q [heads, qk_nope + qk_rope], or through a low-rank bottleneck,
  RMSNorm(x W_qa) W_qb (`q_lora_rank`; V2-Lite has none);
- the latent and the rotary key: x W_kva = [c, k_rope], c [kv_lora_rank] RMS-normalized,
  k_rope [qk_rope_head_dim] one rotary key shared by every head;
- keys and values: c W_kvb = [k_nope, v] per head ([heads, qk_nope + v_head_dim]); each head's
  key is [k_nope, k_rope], its query's last qk_rope features rotated.

Scores are scaled by 1/sqrt(qk_nope + qk_rope), times YaRN's mscale squared where the rotary
scaling has one (`attention_scale`, as transformers' `yarn_apply_mscale`). The rotary
features rotate in pairs (x0, x1), (x2, x3) ("interleaved": DeepSeek's layout; transformers'
`rope_interleave` de-interleaves them on the fly, which leaves every score as it is).

Training and prefill attend in the expanded form through the attention kernels
(models/attention_kernels/): the values' width differs from the keys' (DeepSeek-V3: 192 and
128), which the einsum and splash rows take as it is; another row gets the values padded
with zeros to the keys' width (and its output cut back). A decode step never expands:
the cache ("latent" layout) holds c and the rotated k_rope of each token, [slots, 1, entries,
kv_lora_rank] and [slots, 1, entries, qk_rope_head_dim], and the up projections are absorbed
(W_uk into the query, q_nope W_uk is a query in latent space; W_uv into the output), so a
step is one multi-query attention over latents (attention_kernels/latent.py):
kv_lora_rank + qk_rope_head_dim values per token and layer, 576 at DeepSeek-V3's sizes
where its heads' keys and values would be 128 x (192 + 128) = 40,960.

Parameters (logical axes): `query_kernel` [embed, heads, kv] or `query_a` ([embed, latent],
a Dense with the attention's bias), `query_a_norm`, `query_b_kernel` [q_lora, heads, kv];
`kv_a` ([embed, latent], kv_lora_rank + qk_rope_head_dim wide, with the bias), `kv_a_norm`,
`kv_b_kernel` [kv_lora, heads, kv] (each head's k_nope then v columns, Hugging Face's
kv_b_proj), `out_kernel` [heads, kv, embed]. Each matrix goes through `weight_matmul` (int8)
and `adapted` (LoRA). The up projections' input is `q_lora` / `kv_lora`, not `latent`: they
have no `embed` axis, so that is the one FSDP splits (partitioning.py); the down projections'
output and the norms stay `latent`, whole (at DeepSeek-V3's sizes the two up projections
replicated were 3.3B parameters, 37 GiB of float32 state on every chip).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.models import attention_kernels, kv_cache, lora as adapters, rotary
from lingvo_lite.models import quantization as quantizing
from lingvo_lite.models.attention_kernels.latent import LAYOUT
from lingvo_lite.models.layers import Attention, Context, Dense, Norm, constrain
from lingvo_lite.models.remat import tag
from lingvo_lite.models.weight_matmul import weight_matmul

# The epsilon of the query and latent norms: DeepSeek's reference and transformers fix it
# (`DeepseekV3RMSNorm(q_lora_rank)`), whatever the model's `rms_norm_eps`.
LATENT_NORM_EPS = 1e-6


def yarn_mscale(factor: float, mscale: float) -> float:
  """YaRN's magnitude correction 0.1 mscale ln(factor) + 1 (1 for a factor of at most 1)."""
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class LatentAttention(Attention):
  """`Attention`'s fields (`head_dim`: qk_nope + qk_rope, `rotary_dim`: qk_rope,
  `num_kv_heads`: the heads), with latent attention's own below; the module doc says what
  it computes.

  Attributes:
    q_lora_rank: The queries' bottleneck width; 0: a full query projection.
    kv_lora_rank: The latent's width (what the cache holds per token, with the rotary key).
    v_head_dim: Each head's value width.
    attention_scale: What the scores are multiplied by (1/sqrt(head_dim) x mscale^2).
  """

  q_lora_rank: int = 0
  kv_lora_rank: int = 512
  v_head_dim: int = 128
  attention_scale: float = 1.0

  # Its own cache (the model's `cache_layout()` says the same), stored as "heads" of one.
  cache_layout: str = LAYOUT

  def scale(self) -> float:
    return self.attention_scale

  @property
  def nope_dim(self) -> int:
    return self.head_dim - self.rotary_dim

  def _dense(self, x: jax.Array, features: int, name: str) -> jax.Array:
    return Dense(features, kernel_axes=("embed", "latent"), use_bias=self.use_bias,
                 quantization=self.quantization, lora=self.lora, dtype=self.dtype,
                 param_dtype=self.param_dtype, name=name)(x)

  def _norm(self, x: jax.Array, name: str) -> jax.Array:
    return Norm(kind="rmsnorm", eps=LATENT_NORM_EPS, dtype=self.dtype,
                param_dtype=self.param_dtype, axes=("latent",), name=name)(x)

  def _up(self, x: jax.Array, name: str, shape: tuple[int, ...],
          axes: tuple[str, ...]) -> jax.Array:
    """x [..., in] times the kernel `name` of `shape` [in, heads, width]."""
    kernel = self._weight(name, shape, axes, shape[0])
    y = weight_matmul(x, kernel, 1, self.quantization)
    return adapters.adapted(self, name, x, y, shape, axes, 1, self.lora)

  def _queries(self, x: jax.Array) -> jax.Array:
    """[b, t, heads, head_dim], unrotated."""
    if not self.q_lora_rank:  # No bias, whatever the attention's (transformers' q_proj).
      return self._up(x, "query_kernel", (x.shape[-1], self.num_heads, self.head_dim),
                      ("embed", "heads", "kv"))
    low = self._norm(self._dense(x, self.q_lora_rank, "query_a"), "query_a_norm")
    return self._up(low, "query_b_kernel", (self.q_lora_rank, self.num_heads, self.head_dim),
                    ("q_lora", "heads", "kv"))

  def _kv_b_kernel(self) -> jax.Array:
    """The latent's up projection [kv_lora_rank, heads, qk_nope + v_head_dim] as decoding's
    absorbed matmuls take it: float (an int8 weight dequantized), its LoRA update merged."""
    shape = (self.kv_lora_rank, self.num_heads, self.nope_dim + self.v_head_dim)
    axes = ("kv_lora", "heads", "kv")
    kernel = self._weight("kv_b_kernel", shape, axes, shape[0])
    if quantizing.is_quantized(kernel):
      kernel = quantizing.dequantize(kernel).astype(self.dtype)
    # The update of the kernel's adapters (none: zero): the identity's image under them.
    eye = jnp.eye(shape[0], dtype=self.dtype)
    update = adapters.adapted(self, "kv_b_kernel", eye, jnp.zeros(shape, self.dtype), shape,
                              axes, 1, self.lora)
    return kernel + update

  def _training_attention(self, q: jax.Array, k: jax.Array, v: jax.Array,
                          segment_ids: jax.Array | None) -> jax.Array:
    """The expanded attention through the kernels table; values padded to the keys' width
    for a row that takes only one width (the module doc)."""
    kernel = self._training_kernel(q.shape[1], segment_ids, None)
    width = v.shape[-1]
    if kernel.value_width or width == self.head_dim:
      return kernel.attend(self, q, k, v, segment_ids, None)
    if width > self.head_dim:  # Zero features of queries and keys add nothing to a score.
      extra = [(0, 0)] * 3 + [(0, width - self.head_dim)]
      q, k = jnp.pad(q, extra), jnp.pad(k, extra)
    else:
      v = jnp.pad(v, [(0, 0)] * 3 + [(0, self.head_dim - width)])
    return kernel.attend(self, q, k, v, segment_ids, None)[..., :width]

  def _absorbed(self, q_nope: jax.Array, q_rope: jax.Array, latent: jax.Array,
                rope_key: jax.Array, positions: jax.Array, context: Context
                ) -> tuple[jax.Array, Context]:
    """Decoding: the new tokens' latents and rotary keys written at their entries, then one
    multi-query attention over the latents (the module doc): [b, t, heads, v_head_dim]."""
    kv_b = self._kv_b_kernel()
    w_uk, w_uv = kv_b[..., :self.nope_dim], kv_b[..., self.nope_dim:]
    entry = self._cache_entry(positions, context.keys.shape[-2])
    latents, rope_keys = (
        kv_cache.write_tokens(cached, new, entry, self.cache_layout, context.layer)
        for cached, new in ((context.keys, latent), (context.values, rope_key)))
    layer_cache = (latents, rope_keys) if context.layer is None else (
        latents[context.layer], rope_keys[context.layer])
    q_latent = jnp.einsum("bthn,chn->bthc", q_nope, w_uk)
    q = jnp.concatenate([q_latent, q_rope], axis=-1) * jnp.asarray(self.scale(), self.dtype)
    step = attention_kernels.DecodeStep(self, q, layer_cache, positions, None,
                                        self.cache_layout)
    out = attention_kernels.for_decoding(self.implementation, self.cache_layout, step).attend(
        step)
    out = jnp.einsum("bthc,chv->bthv", out, w_uv)
    return out, context._replace(keys=latents, values=rope_keys)

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
               context: Context | None = None, return_kv: bool = False) -> Any:
    """`Attention.__call__`'s contract; what a prefill returns and a decode cache holds is
    (the latents [b, t, 1, kv_lora_rank], the rotated keys [b, t, 1, qk_rope_head_dim])."""
    dim, nope = x.shape[-1], self.nope_dim
    q = tag(self._queries(x), "query_proj")
    compressed = tag(self._dense(x, self.kv_lora_rank + self.rotary_dim, "kv_a"), "key_proj")
    latent = self._norm(compressed[..., :self.kv_lora_rank], "kv_a_norm")[:, :, None]
    sin, cos = rotary.sin_cos(positions, self.rotary_dim, self.rotary_base,
                              self.rotary_scaling)
    q_nope = q[..., :nope]
    q_rope = rotary.apply(q[..., nope:], sin, cos, self.rotary_style)
    rope_key = rotary.apply(compressed[:, :, None, self.kv_lora_rank:], sin, cos,
                            self.rotary_style)
    if context is not None:
      out, context = self._absorbed(q_nope, q_rope, latent, rope_key, positions, context)
    else:
      shape = (self.kv_lora_rank, self.num_heads, nope + self.v_head_dim)
      kv = tag(self._up(latent[:, :, 0], "kv_b_kernel", shape, ("kv_lora", "heads", "kv")),
               "value_proj")
      k = jnp.concatenate(
          [kv[..., :nope], jnp.broadcast_to(rope_key, (*kv.shape[:3], self.rotary_dim))], -1)
      q = constrain(jnp.concatenate([q_nope, q_rope], -1), "batch", "length", "heads", "kv")
      k = constrain(k, "batch", "length", "heads", "kv")
      v = constrain(kv[..., nope:], "batch", "length", "heads", "kv")
      out = tag(self._training_attention(q, k, v, segment_ids), "attention_out")
    y = self._output(out, self.v_head_dim, dim)
    if context is not None:
      return y, context
    return (y, (latent, rope_key)) if return_kv else y
