"""Building blocks of a decoder-only transformer: norms, attention, MLP (rotary positions are
models/rotary.py's).

Every parameter is created with logical axis names (`embed`, `heads`, `kv`, `mlp`, `vocab`,
`norm`) so the partitioner can map them to mesh axes; key activations carry logical
constraints (`batch`, `length`, ...) that are no-ops unless a mesh and rules are active.

The attention layer here is its projections, its hooks (what a query sees, where the cache
holds a token) and the cache write; how it attends is its kernel's, a row of
models/attention_kernels/ (the written-out einsum, the fused and TPU kernels, the decode
kernel), which it asks by the facts of the call, never by a kernel's name.
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.models import attention_kernels, kv_cache, lora as adapters, rotary
from lingvo_lite.models import quantization as quantizing
# The written-out attention's mask and softmax and "auto"'s choice, where callers of the layers
# have reached them.
# pylint: disable=unused-import
from lingvo_lite.models.attention_kernels import resolve_implementation
from lingvo_lite.models.attention_kernels.einsum import attention_mask, unnormalized_softmax
# pylint: enable=unused-import
from lingvo_lite.models.kv_cache import ring_positions
from lingvo_lite.models.quantization import Quantization
from lingvo_lite.models.remat import tag
from lingvo_lite.models.weight_matmul import weight_matmul
from lingvo_lite.target import current_platform

DType = Literal["float32", "bfloat16", "float16"]
# "rmsnorm_plus_one": RMSNorm whose learned scale is 1 + weight (Gemma's; the weight starts at 0).
NormKind = Literal["layernorm", "rmsnorm", "rmsnorm_plus_one"]
Activation = Literal["gelu_tanh", "gelu", "relu", "swiglu", "geglu"]
RotaryStyle = rotary.RotaryStyle
# RMSNorm of the queries and keys before rotary positions: "head" over each head's features
# (one scale of head_dim, Qwen3 and Gemma 3), "projection" over the whole projection (a scale
# per head and feature, OLMo 2 and 3).
QkNorm = Literal["none", "head", "projection"]

# Gated activations need two input projections (value and gate).
GATED_ACTIVATIONS = ("swiglu", "geglu")


class Context(NamedTuple):
  """The decode cache as one layer's attention sees it (lingvo_lite/models/kv_cache.py).

  Attributes:
    keys, values: This layer's cached keys and values (rotated keys) in the layer's
      `cache_layout` (models/kv_cache.py): [batch, kv_heads, entries, head_dim] or [batch,
      entries, kv_heads * head_dim]; or, with `layer`, every layer's, stacked on a leading
      axis. Which position an entry holds is the
      attention's choice: `Attention._cached_attention` keeps position p at entry p (a
      family's subclass may keep a ring of the last few).
    layer: None, or this layer's index in the stacked arrays (a traced scalar inside a scan
      over layers).
  """

  keys: jax.Array
  values: jax.Array
  layer: Any = None


def constrain(x: jax.Array, *axes: str | None) -> jax.Array:
  """Attaches a logical sharding constraint to an activation."""
  return nn.with_logical_constraint(x, axes)


def dense_init(axes: tuple[str | None, ...], fan_in: int) -> nn.initializers.Initializer:
  """Truncated-normal init scaled by 1/sqrt(fan_in), tagged with logical axes."""
  init = nn.initializers.truncated_normal(stddev=1.0 / math.sqrt(fan_in))
  return nn.with_logical_partitioning(init, axes)


def in_compute_dtype(weight: Any, dtype: jnp.dtype) -> Any:
  """A weight as its matmul takes it: cast to the compute dtype, or an int8 weight as it is
  (models/quantization.py; its matmul dequantizes it)."""
  return weight if quantizing.is_quantized(weight) else weight.astype(dtype)


class Dense(nn.Module):
  """x [..., in] @ kernel [in, features] (+ bias), through `weight_matmul` (so under
  `quantization` too); `nn.Dense`'s parameters (`kernel`, `bias`), created in its order with
  its initializers, so a model built on either has the same parameters."""

  features: int
  kernel_axes: tuple[str, str]
  use_bias: bool = True
  quantization: Quantization | None = None
  lora: adapters.LoraSettings | None = None  # Its adapter, where targeted (models/lora.py).
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param("kernel", dense_init(self.kernel_axes, x.shape[-1]),
                        (x.shape[-1], self.features), self.param_dtype)
    x = x.astype(self.dtype)
    y = weight_matmul(x, in_compute_dtype(kernel, self.dtype), 1, self.quantization)
    y = adapters.adapted(self, "kernel", x, y, (x.shape[-1], self.features), self.kernel_axes,
                         1, self.lora)
    if self.use_bias:
      init = nn.with_logical_partitioning(nn.initializers.zeros, (self.kernel_axes[1],))
      y = y + self.param("bias", init, (self.features,), self.param_dtype).astype(self.dtype)
    return y


class Norm(nn.Module):
  """LayerNorm (scale and offset) or RMSNorm (scale only; or 1 + a weight that starts at 0),
  computed in float32, over the trailing axes of x that `axes` names (the scale's logical
  axes: the model width by default; one head's features, or every head's, for a query norm)."""

  kind: NormKind = "layernorm"
  eps: float = 1e-5
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  axes: tuple[str, ...] = ("norm",)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    features, over = x.shape[-len(self.axes):], tuple(range(-len(self.axes), 0))
    plus_one = self.kind == "rmsnorm_plus_one"
    init = nn.initializers.zeros if plus_one else nn.initializers.ones
    scale = self.param("scale", nn.with_logical_partitioning(init, self.axes), features,
                       self.param_dtype).astype(jnp.float32)
    if plus_one:
      scale = 1.0 + scale
    x32 = x.astype(jnp.float32)
    mean_square = jnp.mean(jnp.square(x32), axis=over, keepdims=True)
    if self.kind != "layernorm":
      return (x32 * (jax.lax.rsqrt(mean_square + self.eps) * scale)).astype(self.dtype)
    # var = E[x^2] - E[x]^2: both moments in one pass over x; the scale is folded into the
    # per-token factor so the [tokens, dim] tensor is touched by one multiply-add.
    mean = jnp.mean(x32, axis=over, keepdims=True)
    variance = jnp.maximum(mean_square - jnp.square(mean), 0.0)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, self.axes),
                      features, self.param_dtype).astype(jnp.float32)
    y = (x32 - mean) * (jax.lax.rsqrt(variance + self.eps) * scale) + bias
    return y.astype(self.dtype)


class Attention(nn.Module):
  """Causal multi-head attention with grouped-query support, optional rotary embedding, an
  optional sliding window and an optional RMSNorm of queries and keys.

  How it attends is its kernel's (`implementation`, a row of models/attention_kernels/); what
  a query sees goes through hooks, which every kernel asks: `sliding_window()` (the positions
  a query sees; every training and prefill kernel takes it: the einsum's mask, the fused
  kernels' local window, splash's band), `sinks()`, and for decoding `_cache_entry` (where a
  new token's keys and values go in the cache), `_cache_mask` (which entries a query sees) and
  `_cache_prefix` (the same as a count of leading entries, for the TPU's decode kernel). With
  a `window` the decode cache is a ring of the last entries (position p at entry p % entries,
  models/kv_cache.py); a family whose attention differs otherwise overrides the hooks rather
  than a kernel. `cache_layout` names how its cache holds the keys and values of every
  key/value head ("heads" or "positions": the model's `cache_layout()`, decided by its
  kernel's decode forms): a decode step takes a kernel's form that reads that layout.

  Attributes:
    window: Positions each query sees, its own included (a sliding window); None: every
      earlier position.
    query_scale: What the queries are multiplied by before their scores; None: 1/sqrt(head_dim).
    qk_norm: "none", or RMSNorm ("head": of each head's features; "projection": of the whole
      projection) of queries and keys before the rotary positions, of `norm_kind` and
      `norm_eps` (the model's norms').
  """

  num_heads: int
  num_kv_heads: int
  head_dim: int
  use_bias: bool = False
  rotary_dim: int = 0  # 0 disables rotary embedding.
  rotary_style: RotaryStyle = "interleaved"
  rotary_base: float = 10000.0
  rotary_scaling: tuple[Any, ...] = ()  # rotary.inverse_frequencies' `scaling`.
  window: int | None = None
  query_scale: float | None = None
  qk_norm: QkNorm = "none"
  norm_kind: NormKind = "rmsnorm"
  norm_eps: float = 1e-6
  # A row of models/attention_kernels/, resolved by the model ("auto" is resolved before a
  # layer is built; left here, it is the einsum row).
  implementation: attention_kernels.AttentionImplementation = "einsum"
  quantization: Quantization | None = None  # Of the projections (models/quantization.py).
  lora: adapters.LoraSettings | None = None  # The projections' adapters (models/lora.py).
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  # The decode cache's layout (models/kv_cache.py), which the model decides
  # (`cache_layout()`); its kernels' decode forms say which they read.
  cache_layout: str = attention_kernels.HEADS

  @classmethod
  def has_sinks(cls) -> bool:
    """Whether `sinks()` is a family's own (then "auto" passes by the kernels taking none)."""
    return cls.sinks is not Attention.sinks

  def sliding_window(self) -> int | None:
    """Positions each query sees, its own included; None: every earlier position."""
    return self.window

  def sinks(self) -> jax.Array | None:
    """float32 [heads]: a learned logit per query head that each query's softmax also sums
    over, taking weight from the keys without a value (gpt-oss's attention sinks); None for
    none. Called once per call (it may create a parameter); every path takes its value."""
    return None

  def scale(self) -> float:
    """What queries are multiplied by before their scores."""
    return self.query_scale if self.query_scale is not None else 1.0 / math.sqrt(self.head_dim)

  def _weight(self, name: str, shape: tuple[int, ...], axes: tuple[str, ...],
              fan_in: int) -> Any:
    return in_compute_dtype(self.param(name, dense_init(axes, fan_in), shape, self.param_dtype),
                            self.dtype)

  def _bias(self, name: str, shape: tuple[int, ...], axes: tuple[str, ...]) -> jax.Array:
    init = nn.with_logical_partitioning(nn.initializers.zeros, axes)
    return self.param(name, init, shape, self.param_dtype).astype(self.dtype)

  def _project(self, x: jax.Array, name: str, heads: int) -> jax.Array:
    """[b, t, dim] -> [b, t, heads, head_dim]; kernels are stored 3-D with logical axes."""
    dim = x.shape[-1]
    shape, axes = (dim, heads, self.head_dim), ("embed", "heads", "kv")
    kernel = self._weight(f"{name}_kernel", shape, axes, dim)
    y = weight_matmul(x, kernel, 1, self.quantization)
    y = adapters.adapted(self, f"{name}_kernel", x, y, shape, axes, 1, self.lora)
    if self.use_bias:
      y = y + self._bias(f"{name}_bias", (heads, self.head_dim), ("heads", "kv"))
    return y

  def _cache_entry(self, positions: jax.Array, entries: int) -> jax.Array:
    """int32 [batch, length]: the cache entry each new token's keys and values go to (of the
    `entries` a slot holds): its position; with a window, a ring of the last `entries`
    positions keeps p at p % entries, writing over the position that left the window. A
    ring takes one token per slot and call (what decoding feeds): several would overwrite
    entries that their earlier tokens still see."""
    if self.sliding_window() is None:
      return positions
    return positions % entries

  def _cache_mask(self, positions: jax.Array, entries: int) -> jax.Array:
    """bool [batch, length, entries]: the cache entries each query at `positions` attends to,
    its own written already: every entry up to its position (those past it are stale: an
    earlier request's, or padding); with a window, the entries whose position is this
    request's and within the window of the query."""
    window = self.sliding_window()
    if window is None:
      return jnp.arange(entries, dtype=jnp.int32)[None, None, :] <= positions[:, :, None]
    held = ring_positions(positions, entries)  # [batch, length, entries]
    return (held >= 0) & (positions[..., None] - held < window)

  def _cache_prefix(self, positions: jax.Array, entries: int) -> jax.Array | None:
    """int32 [batch]: how many leading entries a single query at `positions` [batch] sees,
    when what `_cache_mask` lets it see is exactly those (the TPU decode kernel's form,
    models/decode_attention.py); None when it is not a prefix. Here entries 0..p, and with a
    window all of a full ring: every position a ring holds is within the window (it holds at
    most `window`), and where in the ring each sits does not change a softmax over them. A
    subclass with a mask of its own says its prefix itself, or has none."""
    if type(self)._cache_mask is not Attention._cache_mask:
      return None
    return jnp.minimum(positions + 1, entries)

  def _attention(self, q: jax.Array, k: jax.Array, v: jax.Array,
                 segment_ids: jax.Array | None, sinks: jax.Array | None = None) -> jax.Array:
    """Training's and prefill's attention: `implementation`'s kernel, or the one it falls
    back to for a call it has no form for (a mask it does not apply, a length its blocks do
    not divide)."""
    return self._training_kernel(q.shape[1], segment_ids, sinks).attend(
        self, q, k, v, segment_ids, sinks)

  def _training_kernel(self, length: int, segment_ids: jax.Array | None,
                       sinks: jax.Array | None) -> attention_kernels.Kernel:
    """The row that attends a training or prefill call of `length` queries."""
    needs = (("segments", segment_ids is not None),
             ("window", self.sliding_window() is not None), ("sinks", sinks is not None))
    call = attention_kernels.Call(current_platform(), length=length,
                                  masks=frozenset(mask for mask, needed in needs if needed))
    return attention_kernels.for_training(self.implementation, call)

  def _cached_attention(self, q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                        context: Context, sinks: jax.Array | None = None
                        ) -> tuple[jax.Array, Context]:
    """Decoding: writes the new tokens' keys and values into the cache at their entries
    (`_cache_entry`), then attends to the entries each query sees (`_cache_mask`) through the
    decode form of `implementation`'s kernel that reads this cache and fits the step.

    Writing first, then reading, lets XLA update the cache in place: attending to the old
    cache and writing after made it copy the whole cache twice per step (measured).
    """
    batch, length = q.shape[:2]
    group = self.num_heads // self.num_kv_heads
    entry = self._cache_entry(positions, context.keys.shape[-2])
    keys, values = (kv_cache.write_tokens(cached, new, entry, self.cache_layout, context.layer)
                    for cached, new in ((context.keys, k), (context.values, v)))
    layer_cache = (keys, values) if context.layer is None else (
        keys[context.layer], values[context.layer])
    q = q * jnp.asarray(self.scale(), self.dtype)
    q = q.reshape(batch, length, self.num_kv_heads, group, self.head_dim)
    step = attention_kernels.DecodeStep(self, q, layer_cache, positions, sinks,
                                        self.cache_layout)
    out = attention_kernels.for_decoding(self.implementation, self.cache_layout, step).attend(
        step)
    return out, context._replace(keys=keys, values=values)

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
               context: Context | None = None, return_kv: bool = False) -> Any:
    """The attention output, alone or in a pair.

    `segment_ids` [batch, length] keeps each token within its packed document; None: one
    document per row (causal only, which fused kernels take as a flag).

    With `return_kv`: `(output, (keys, values))`, also this call's keys and values
    [b, t, kv_heads, d] (rotated), which a prefill writes into a decode cache.

    With a `context` (decoding): `(output, context)`, the context's cache holding this
    call's keys and values at `positions`; the tokens attend to every entry up to their
    own position (`segment_ids` is unused).

    The projections and the attention's output carry remat names (models/remat.py), so a
    remat policy can keep them for the backward pass.
    """
    dim = x.shape[-1]
    q = tag(self._project(x, "query", self.num_heads), "query_proj")
    k = tag(self._project(x, "key", self.num_kv_heads), "key_proj")
    v = tag(self._project(x, "value", self.num_kv_heads), "value_proj")
    if self.qk_norm != "none":
      axes = ("kv",) if self.qk_norm == "head" else ("heads", "kv")
      q, k = (Norm(kind=self.norm_kind, eps=self.norm_eps, dtype=self.dtype,
                   param_dtype=self.param_dtype, axes=axes, name=name)(y)
              for name, y in (("query_norm", q), ("key_norm", k)))
    if self.rotary_dim:
      sin, cos = rotary.sin_cos(positions, self.rotary_dim, self.rotary_base,
                                self.rotary_scaling)
      q = rotary.apply(q, sin, cos, self.rotary_style)
      k = rotary.apply(k, sin, cos, self.rotary_style)
    q = constrain(q, "batch", "length", "heads", "kv")
    k = constrain(k, "batch", "length", "heads", "kv")
    v = constrain(v, "batch", "length", "heads", "kv")
    sinks = self.sinks()
    if context is not None:
      out, context = self._cached_attention(q, k, v, positions, context, sinks)
    else:
      out = tag(self._attention(q, k, v, segment_ids, sinks), "attention_out")
    y = self._output(out, self.head_dim, dim)
    if context is not None:
      return y, context
    return (y, (k, v)) if return_kv else y

  def _output(self, out: jax.Array, value_width: int, dim: int) -> jax.Array:
    """The heads' outputs [batch, length, heads, value_width] projected back to `dim` (the
    output kernel with its adapters, int8 and bias): every attention layer's last step."""
    out = constrain(out, "batch", "length", "heads", "kv")
    shape, axes = (self.num_heads, value_width, dim), ("heads", "kv", "embed")
    kernel = self._weight("out_kernel", shape, axes, self.num_heads * value_width)
    y = adapters.adapted(self, "out_kernel", out, weight_matmul(out, kernel, 2, self.quantization),
                         shape, axes, 2, self.lora)
    y = tag(y, "out_proj")
    if self.use_bias:
      y = y + self._bias("out_bias", (dim,), ("embed",))
    return y


def _activate(x: jax.Array, activation: Activation) -> jax.Array:
  if activation in ("gelu_tanh", "geglu"):
    return jax.nn.gelu(x, approximate=True)
  if activation == "gelu":
    return jax.nn.gelu(x, approximate=False)
  if activation == "swiglu":
    return jax.nn.silu(x)
  return jax.nn.relu(x)


class Mlp(nn.Module):
  """Feed-forward layer: dim -> mlp_dim -> dim, optionally gated (SwiGLU, GeGLU)."""

  mlp_dim: int
  activation: Activation = "gelu_tanh"
  use_bias: bool = True
  quantization: Quantization | None = None
  lora: adapters.LoraSettings | None = None  # The matrices' adapters (models/lora.py).
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  def _dense(self, x: jax.Array, features: int, axes: tuple[str, str], name: str) -> jax.Array:
    return Dense(features, kernel_axes=axes, use_bias=self.use_bias,
                 quantization=self.quantization, lora=self.lora, dtype=self.dtype,
                 param_dtype=self.param_dtype, name=name)(x)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """The projections' outputs carry remat names ("mlp_in", "mlp_out": models/remat.py)."""
    hidden = tag(self._dense(x, self.mlp_dim, ("embed", "mlp"), "wi"), "mlp_in")
    hidden = _activate(hidden, self.activation)
    if self.activation in GATED_ACTIVATIONS:
      hidden = hidden * tag(self._dense(x, self.mlp_dim, ("embed", "mlp"), "wi_gate"),
                            "mlp_in")
    hidden = constrain(hidden, "batch", "length", "mlp")
    return tag(self._dense(hidden, x.shape[-1], ("mlp", "embed"), "wo"), "mlp_out")
