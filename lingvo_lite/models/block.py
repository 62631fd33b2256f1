"""One transformer layer, shared by the families built on `transformer.TransformerLM`, and a
group of layers of a repeating pattern (what a scan over mixed attention kinds steps by).

Where the norms sit (`BlockKind`):

| kind       | one layer                                                       | family      |
|------------|-----------------------------------------------------------------|-------------|
| parallel   | x + attn(n(x)) + mlp(n(x)), one norm                            | GPT-J       |
| sequential | x + attn(n1(x)); then x + mlp(n2(x)) (pre-norm)                 | GPT-2, Llama|
| sandwich   | x + n1'(attn(n1(x))); then x + n2'(mlp(n2(x))) (pre and post)   | Gemma 2, 3  |
| post_norm  | x + n1'(attn(x)); then x + n2'(mlp(x)) (post-norm only)         | OLMo 2, 3   |
"""

from __future__ import annotations

from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.models import attention_kernels, layers
from lingvo_lite.models.lora import LoraSettings
from lingvo_lite.models.quantization import Quantization

BlockKind = Literal["parallel", "sequential", "sandwich", "post_norm"]
# The parameter names of each kind's norms: before attention, after it, before the MLP, after
# it (None where the kind has none; "parallel" has one, before both).
_NORMS = {"parallel": ("norm", None, None, None),
          "sequential": ("attention_norm", None, "mlp_norm", None),
          "sandwich": ("attention_norm", "attention_post_norm", "mlp_norm", "mlp_post_norm"),
          "post_norm": (None, "attention_post_norm", None, "mlp_post_norm")}


def _residual(x: jax.Array) -> jax.Array:
  """`x` [batch, length, dim] of the residual stream, under its logical constraint."""
  return layers.constrain(x, "batch", "length", "activation_embed")


def _summand(y: jax.Array) -> jax.Array:
  """A projection's output [batch, length, dim] before it joins the residual stream: summed
  over its contracted (tensor-split) axis at the whole width, then sliced to the stream's
  split. Reduce-scattered straight onto `tensor` while its weight splits the width over
  `fsdp` and the batch is over data x fsdp, jax 0.10.2's SPMD partitioner swaps the batch
  shards of the (data 0, fsdp 1) and (data 1, fsdp 0) devices and never swaps them back:
  rows 2-5 of 8 on data=2 x fsdp=2 x tensor=2 were other rows' sums
  (bench/results/2026-12-07/maxtext_act_embed/README.md, "A partitioner bug")."""
  return layers.constrain(y, "batch", "length", None)


def norm_count(kind: BlockKind) -> int:
  """How many norms a layer of `kind` has."""
  return sum(name is not None for name in _NORMS[kind])


class Block(nn.Module):
  """One transformer layer.

  Takes its own sizes as plain fields so `nn.scan` and `nn.remat` can lift it as a class.
  With `scan_carry` it returns `(x, None)`, the (carry, output) pair `nn.scan` expects; with
  `return_kv`, `(x, kv)`: also the layer's new keys and values (for a decoder's cache).
  `attention_type` is the attention layer's class (a family's own subclass of
  `layers.Attention`), built with the sizes below and `attention_options`, the pairs of its
  own further fields. The fields from `window` to `qk_norm` are the layer's attention kind's
  (`layers.Attention`'s fields of those names). `mlp_type`: None for `layers.Mlp` of the
  `mlp_*` fields, or another feed-forward layer's class (a mixture of experts,
  models/moe.py) built with `mlp_options`, the quantization and the dtypes.
  """

  kind: BlockKind
  norm_kind: layers.NormKind
  norm_eps: float
  num_heads: int
  num_kv_heads: int
  head_dim: int
  attention_bias: bool
  rotary_dim: int
  rotary_style: layers.RotaryStyle
  rotary_base: float
  rotary_scaling: tuple[Any, ...]
  attention_implementation: attention_kernels.AttentionImplementation
  mlp_dim: int
  mlp_activation: layers.Activation
  mlp_bias: bool
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  quantization: Quantization | None = None
  window: int | None = None
  query_scale: float | None = None
  qk_norm: layers.QkNorm = "none"
  lora: LoraSettings | None = None
  attention_type: type[layers.Attention] = layers.Attention
  attention_options: tuple[tuple[str, Any], ...] = ()
  cache_layout: str = attention_kernels.HEADS  # The decode cache's (models/kv_cache.py).
  mlp_type: Any = None
  mlp_options: tuple[tuple[str, Any], ...] = ()
  scan_carry: bool = False
  return_kv: bool = False

  def _norm(self, name: str | None) -> Any:
    if name is None:
      return lambda x: x
    return layers.Norm(kind=self.norm_kind, eps=self.norm_eps, dtype=self.dtype,
                       param_dtype=self.param_dtype, name=name)

  @nn.compact
  def __call__(self, x: Any, positions: jax.Array, segment_ids: jax.Array | None,
               layer: Any = None):
    """`x` [batch, length, dim]; when decoding, the pair (x, cache): this layer's decode
    cache (keys, values), or with `layer` (inside a scan) a stack of layers' (this one at
    index `layer`). Returns x, or (x, kv) with `return_kv`, or (x, cache) when decoding; as
    the carry of a pair with `scan_carry`."""
    cache = None
    if isinstance(x, tuple):
      x, cache = x
    # The residual stream keeps its width split as the rules say (`activation_embed`: over
    # tensor by default) at the layer's input (what remat keeps, the scan's carry), between
    # attention and MLP and at its output; XLA gathers it for the projections that read it.
    x = _residual(x)
    context = None if cache is None else layers.Context(*cache, layer)
    attention = self.attention_type(
        num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
        use_bias=self.attention_bias, rotary_dim=self.rotary_dim,
        rotary_style=self.rotary_style, rotary_base=self.rotary_base,
        rotary_scaling=self.rotary_scaling, window=self.window, query_scale=self.query_scale,
        qk_norm=self.qk_norm, norm_kind=self.norm_kind, norm_eps=self.norm_eps,
        implementation=self.attention_implementation, quantization=self.quantization,
        lora=self.lora, dtype=self.dtype, param_dtype=self.param_dtype, name="attention",
        cache_layout=self.cache_layout, **dict(self.attention_options))
    if self.mlp_type is None:
      mlp = layers.Mlp(mlp_dim=self.mlp_dim, activation=self.mlp_activation,
                       use_bias=self.mlp_bias, quantization=self.quantization, lora=self.lora,
                       dtype=self.dtype, param_dtype=self.param_dtype, name="mlp")
    else:
      # A family's own feed-forward layer (a mixture of experts) has no LoRA adapters: its
      # weights are not targets (models/lora.py).
      mlp = self.mlp_type(**dict(self.mlp_options), quantization=self.quantization,
                          dtype=self.dtype, param_dtype=self.param_dtype, name="mlp")
    extra = None  # What attention returns besides its output: new kv, or the cache.
    wants_extra = self.return_kv or context is not None
    attention_norm, attention_post_norm, mlp_norm, mlp_post_norm = _NORMS[self.kind]
    h = self._norm(attention_norm)(x)
    attended = attention(h, positions, segment_ids, context, self.return_kv)
    if wants_extra:
      attended, extra = attended
    attended = _summand(attended)
    if self.kind == "parallel":
      x = x + attended + _summand(mlp(h))
    else:
      x = _residual(x + self._norm(attention_post_norm)(attended))
      x = x + self._norm(mlp_post_norm)(_summand(mlp(self._norm(mlp_norm)(x))))
    x = _residual(x)
    if context is not None:
      out = (x, (extra.keys, extra.values))
      return (out, None) if self.scan_carry else out
    if self.scan_carry:
      return x, extra
    return (x, extra) if self.return_kv else x


class BlockGroup(nn.Module):
  """Layers of a repeating pattern of attention kinds, one after the other: what a scan over
  a stack of mixed kinds steps by (models/transformer.py). Member j is `pattern_j`, a
  `block_class` of `members[j]`'s fields.

  The carry is x, or (x, caches) when decoding: `caches` holds each member's stacked
  (keys, values) over the groups, this group's at index `layer`. Returns (carry, kv): with
  `return_kv`, each member's new keys and values, else None.
  """

  members: tuple[tuple[tuple[str, Any], ...], ...]
  block_class: Any = Block
  return_kv: bool = False

  @nn.compact
  def __call__(self, carry: Any, positions: jax.Array, segment_ids: jax.Array | None,
               layer: Any = None):
    x, caches = carry if isinstance(carry, tuple) else (carry, None)
    new_kv, new_caches = [], []
    for index, fields in enumerate(self.members):
      block = self.block_class(**dict(fields), return_kv=self.return_kv and caches is None,
                               name=f"pattern_{index}")
      if caches is not None:
        x, cache = block((x, caches[index]), positions, segment_ids, layer)
        new_caches.append(cache)
      elif self.return_kv:
        x, kv = block(x, positions, segment_ids, layer)
        new_kv.append(kv)
      else:
        x = block(x, positions, segment_ids, layer)
    if caches is not None:
      return (x, tuple(new_caches)), None
    return x, (tuple(new_kv) if self.return_kv else None)
