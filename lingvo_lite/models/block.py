"""One transformer layer, parallel (GPT-J) or sequential (pre-norm GPT-2 / Llama), shared by the
families built on `transformer.TransformerLM`."""

from __future__ import annotations

from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.models import layers
from lingvo_lite.models.lora import LoraSettings
from lingvo_lite.models.quantization import Quantization

BlockKind = Literal["parallel", "sequential"]


class Block(nn.Module):
  """One transformer layer.

  Takes its own sizes as plain fields so `nn.scan` and `nn.remat` can lift it as a class.
  With `scan_carry` it returns `(x, None)`, the (carry, output) pair `nn.scan` expects; with
  `return_kv`, `(x, kv)`: also the layer's new keys and values (for a decoder's cache).
  `attention_type` is the attention layer's class (a family's own subclass of
  `layers.Attention`), built with the sizes below and `attention_options`, the pairs of its
  own further fields (a sliding window's width, say).
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
  attention_implementation: layers.AttentionImplementation
  mlp_dim: int
  mlp_activation: layers.Activation
  mlp_bias: bool
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  quantization: Quantization | None = None
  lora: LoraSettings | None = None
  attention_type: type[layers.Attention] = layers.Attention
  attention_options: tuple[tuple[str, Any], ...] = ()
  scan_carry: bool = False
  return_kv: bool = False

  def _norm(self, name: str) -> layers.Norm:
    return layers.Norm(kind=self.norm_kind, eps=self.norm_eps, dtype=self.dtype,
                       param_dtype=self.param_dtype, name=name)

  @nn.compact
  def __call__(self, x: Any, positions: jax.Array, segment_ids: jax.Array | None,
               layer: Any = None):
    """`x` [batch, length, dim]; when decoding, the pair (x, cache): this layer's decode
    cache (keys, values), or with `layer` (inside a scan) every layer's, stacked, this one at
    index `layer`. Returns x, or (x, kv) with `return_kv`, or (x, cache) when decoding; as
    the carry of a pair with `scan_carry`."""
    cache = None
    if isinstance(x, tuple):
      x, cache = x
    context = None if cache is None else layers.Context(*cache, layer)
    attention = self.attention_type(
        num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
        use_bias=self.attention_bias, rotary_dim=self.rotary_dim,
        rotary_style=self.rotary_style, rotary_base=self.rotary_base,
        rotary_scaling=self.rotary_scaling, implementation=self.attention_implementation,
        quantization=self.quantization, lora=self.lora, dtype=self.dtype,
        param_dtype=self.param_dtype, name="attention", **dict(self.attention_options))
    mlp = layers.Mlp(mlp_dim=self.mlp_dim, activation=self.mlp_activation,
                     use_bias=self.mlp_bias, quantization=self.quantization, lora=self.lora,
                     dtype=self.dtype, param_dtype=self.param_dtype, name="mlp")
    extra = None  # What attention returns besides its output: new kv, or the cache.
    wants_extra = self.return_kv or context is not None
    if self.kind == "parallel":
      h = self._norm("norm")(x)
      attended = attention(h, positions, segment_ids, context, self.return_kv)
      if wants_extra:
        attended, extra = attended
      x = x + attended + mlp(h)
    else:
      attended = attention(self._norm("attention_norm")(x), positions, segment_ids, context,
                           self.return_kv)
      if wants_extra:
        attended, extra = attended
      x = x + attended
      x = x + mlp(self._norm("mlp_norm")(x))
    x = layers.constrain(x, "batch", "length", "embed")
    if context is not None:
      out = (x, (extra.keys, extra.values))
      return (out, None) if self.scan_carry else out
    if self.scan_carry:
      return x, extra
    return (x, extra) if self.return_kv else x
