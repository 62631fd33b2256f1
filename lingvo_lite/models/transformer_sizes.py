"""What a `TransformerLM`'s fields make, counted from the fields alone: its parameters (count,
shapes, the weights that multiply activations), its FLOPs, and the fields that size it. A
mixin of `TransformerLM` (models/transformer.py): the family interface's answers about sizes
(models/family.py), reading the transformer's fields.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.models import layers
from lingvo_lite.models.family import ArrayShape

# The fields that size a TransformerLM's parameters (max_length only with learned positions).
_SIZE_FIELDS = ("num_layers", "dim", "mlp_dim", "vocab_size", "num_heads", "num_kv_heads",
                "head_dim", "max_length")


class TransformerSizes:
  """Sizes and FLOPs of a `TransformerLM` (its fields are read; none is declared here)."""

  @nn.nowrap
  def num_parameters(self) -> int:
    """The parameter count, from the sizes alone (nothing is traced), so that an absurd size
    is refused before JAX is asked to shape it. Exact: a test compares it with `init`."""
    dim, heads, kv_heads = self.dim, self.num_heads, self.resolved_num_kv_heads
    head_dim, mlp_dim, vocab = self.resolved_head_dim, self.resolved_mlp_dim, self.vocab_size
    norm = dim if self.norm == "rmsnorm" else 2 * dim  # Scale, and LayerNorm's offset.
    attention = dim * head_dim * (2 * heads + 2 * kv_heads)  # q and out; k and v.
    if self.attention_bias:
      attention += head_dim * (heads + 2 * kv_heads) + dim
    mlp_inputs = 2 if self.mlp_activation in layers.GATED_ACTIVATIONS else 1
    mlp = (mlp_inputs + 1) * dim * mlp_dim + (
        mlp_inputs * mlp_dim + dim if self.mlp_bias else 0)
    block = attention + mlp + norm * (1 if self.block == "parallel" else 2)
    total = self.num_layers * block + vocab * dim + norm
    total += dim if self.embedding_bias else 0
    total += self.max_length * dim if self.position == "learned" else 0
    if not self.tie_embeddings:
      total += dim * vocab + (vocab if self.output_bias else 0)
    return total

  @nn.nowrap
  def parameter_shapes(self) -> list[ArrayShape]:
    """Every parameter's path, logical axes, full shape and dtype, without allocating any.

    Traces a copy with one layer: every layer has the same shapes, and tracing all of them
    takes time in proportion to depth (forever, for an absurd depth). A parameter of the
    unrolled `layer_0` stands for num_layers of them (`repeats`); a scanned one gets its
    leading `layers` axis back at full size.
    """
    sample = self.clone(parent=None, num_layers=1)
    tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    boxed = jax.eval_shape(sample.init, jax.random.key(0), tokens)["params"]
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(
        boxed, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))[0]:
      value = leaf.value if isinstance(leaf, nn.meta.AxisMetadata) else leaf
      axes = tuple(getattr(leaf, "names", (None,) * len(value.shape)))
      shape, repeats = tuple(value.shape), 1
      top = getattr(path[0], "key", None)
      if top == "layer_0":
        repeats = self.num_layers
      elif top == "layers" and axes and axes[0] == "layers":
        shape = (self.num_layers, *shape[1:])
      found.append(ArrayShape(jax.tree_util.keystr(path), axes, shape, jnp.dtype(value.dtype),
                              repeats))
    return found

  @nn.nowrap
  def matmul_parameters(self) -> int:
    """Weights that multiply activations once per token (biases, norms, embedding excluded;
    the unembedding, tied or not, included)."""
    return self.block_matmul_parameters() + self.dim * self.vocab_size

  @nn.nowrap
  def block_matmul_parameters(self) -> int:
    """The blocks' weight matrices (what "int8" training quantizes)."""
    dim, heads, kv_heads = self.dim, self.num_heads, self.resolved_num_kv_heads
    head_dim, mlp_dim = self.resolved_head_dim, self.resolved_mlp_dim
    attention = dim * head_dim * (2 * heads + 2 * kv_heads)  # q, out; k, v
    mlp_inputs = 2 if self.mlp_activation in layers.GATED_ACTIVATIONS else 1
    mlp = (mlp_inputs + 1) * dim * mlp_dim
    return self.num_layers * (attention + mlp)

  @nn.nowrap
  def size_fields(self) -> dict[str, int]:
    return {name: getattr(self, name) for name in _SIZE_FIELDS
            if getattr(self, name) is not None
            and (name != "max_length" or self.position == "learned")}

  # ---------------------------------------------------------------------------- FLOPs

  @nn.nowrap
  def attention_flops_per_token(self, sequence_length: int) -> int:
    """Scores and weighted values: 4 T H d per token and layer, halved for causality (a token
    sees the positions up to its own, half of the sequence on average). An int, so that MFU's
    count stays exact."""
    return 2 * self.num_layers * sequence_length * self.num_heads * self.resolved_head_dim

  @nn.nowrap
  def decode_attention_flops(self, context_length: int) -> int:
    """One new token's scores and weighted values against `context_length` positions."""
    return 4 * self.num_layers * context_length * self.num_heads * self.resolved_head_dim
