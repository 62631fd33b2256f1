"""Multi-token prediction (DeepSeek-V3's MTP modules): D extra blocks that each predict one
token further ahead, trained beside the next-token loss and ignored by decoding.

Module k (1 <= k <= D) at position i takes the previous depth's hidden state h^{k-1}_i (for
k = 1 the main model's last hidden state after its final norm, as vLLM and SGLang feed the
released MTP weights) and the embedding of token i + k, RMS-normalizes each with a norm of its
own (`embedding_norm`: DeepSeek's `enorm`, `hidden_norm`: `hnorm`), projects their
concatenation [embedding; hidden] (2 x dim -> dim: `eh_proj`; the embedding is the token's row,
scaled as the model scales its own, without a learned position or embedding bias) and runs one transformer block
of the last layer's kinds (attention and feed-forward) at the same positions and documents;
the block's output is h^k_i, and its logits (its own final norm, `shared_head.norm`, then the
model's output projection, shared) predict token i + k + 1. Positions whose token i + k is
past the row have the embedding of token 0 there: their predictions are never scored.

Parameters: `multi_token_{k-1}/{embedding_norm, hidden_norm, projection, block, final_norm}`
beside the main model's. They exist (from `init`) whenever the model has depths, so a job
trained without the objective still holds them; only a forward asked for them
(`multi_token=True`: training/objectives/multi_token.py) runs them.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.models import layers
from lingvo_lite.models import quantization as quantizing


def ahead(values: jax.Array, k: int, fill: Any = 0) -> jax.Array:
  """values [B, T, ...] shifted k positions left: position i holds position i + k's value,
  the last k positions `fill`."""
  k = min(k, values.shape[1])
  if k == 0:
    return values
  pad = jnp.full((values.shape[0], k, *values.shape[2:]), fill, values.dtype)
  return jnp.concatenate([values[:, k:], pad], axis=1)


class MultiTokenModule(nn.Module):
  """One depth's module (the module doc): (h^{k-1} [B, T, D], the embedded tokens k ahead
  [B, T, D]) -> (h^k, its final norm) [B, T, D] each.

  Attributes:
    block_class: The transformer block's class (remat applied or not), and `block_fields`
      its fields (the last layer's, as `TransformerLM._block_fields` gives them).
    norm_kind, norm_eps: The model's norm.
  """

  block_class: Any
  block_fields: tuple[tuple[str, Any], ...]
  norm_kind: layers.NormKind
  norm_eps: float
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  def _norm(self, name: str) -> layers.Norm:
    return layers.Norm(kind=self.norm_kind, eps=self.norm_eps, dtype=self.dtype, name=name)

  @nn.compact
  def __call__(self, hidden: jax.Array, embedded: jax.Array, positions: jax.Array,
               segment_ids: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    joined = jnp.concatenate([self._norm("embedding_norm")(embedded),
                              self._norm("hidden_norm")(hidden)], axis=-1)
    # The joined width is 2 x embed: split as the model width is on its input side.
    x = layers.Dense(hidden.shape[-1], kernel_axes=("embed", None), use_bias=False,
                     dtype=self.dtype, param_dtype=self.param_dtype, name="projection")(joined)
    x = layers.constrain(x, "batch", "length", "embed")
    x = self.block_class(**dict(self.block_fields), name="block")(x, positions, segment_ids)
    return x, self._norm("final_norm")(x)


class MultiTokenPrediction:
  """The multi-token modules of a `TransformerLM` (a mixin: its fields are read): none here;
  a model with depths answers `multi_token_depth` (models/moe_transformer.py's
  `multi_token_layers`)."""

  @nn.nowrap
  def multi_token_depth(self) -> int:
    """D, the tokens ahead of the next one the model predicts in training; 0: none."""
    return 0

  def _multi_token_hidden(self, normed: jax.Array, tokens: jax.Array, positions: jax.Array,
                          segment_ids: jax.Array | None, embedding: Any) -> jax.Array:
    """Each depth's normed output stacked on the batch axis [D x B, T, D], for the shared
    output projection (`normed`: the main model's last hidden state after its final norm)."""
    dtype = jnp.dtype(self.dtype)
    # Rows of the whole table, as the main embedding's lookup takes them (FSDP).
    table = jax.tree.map(lambda a: layers.constrain(a, None, None), embedding)
    kinds, mlp_kinds = self.kinds_by_layer(), self.mlp_kinds_by_layer()
    fields = tuple(sorted(self._block_fields(kinds[-1], mlp_kinds[-1]).items()))
    hidden, outputs = normed, []
    for depth in range(1, self.multi_token_depth() + 1):
      embedded = quantizing.take_rows(table, ahead(tokens, depth), dtype)
      if self.embedding_scale == "sqrt_dim":
        embedded = embedded * jnp.asarray(math.sqrt(self.dim), dtype)
      hidden, normed_out = MultiTokenModule(
          self._block_class(False), fields, self.norm, self.norm_eps, dtype,
          jnp.dtype(self.param_dtype), name=f"multi_token_{depth - 1}")(
              hidden, embedded, positions, segment_ids)
      outputs.append(normed_out)
    return jnp.concatenate(outputs, axis=0)
