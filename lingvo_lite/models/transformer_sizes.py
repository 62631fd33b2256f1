"""What a `TransformerLM`'s fields make, counted from the fields alone: its parameters (count,
shapes, the weights that multiply activations), its FLOPs, and the fields that size it. A
mixin of `TransformerLM` (models/transformer.py): the family interface's answers about sizes
(models/family.py), reading the transformer's fields.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.models import block as blocks, layers, transformer_layers
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
    dim, mlp_dim, vocab = self.dim, self.resolved_mlp_dim, self.vocab_size
    norm = 2 * dim if self.norm == "layernorm" else dim  # Scale, and LayerNorm's offset.
    attention = self.attention_parameters()
    mlp_inputs = 2 if self.mlp_activation in layers.GATED_ACTIVATIONS else 1
    mlp = (mlp_inputs + 1) * dim * mlp_dim + (
        mlp_inputs * mlp_dim + dim if self.mlp_bias else 0)
    block = attention + mlp + norm * blocks.norm_count(self.block)
    total = self.num_layers * block + vocab * dim + norm
    total += dim if self.embedding_bias else 0
    total += self.max_length * dim if self.position == "learned" else 0
    if not self.tie_embeddings:
      total += dim * vocab + (vocab if self.output_bias else 0)
    return total

  @nn.nowrap
  def attention_parameters(self) -> int:
    """One layer's attention parameters (a family with other attention counts its own)."""
    dim, heads, kv_heads = self.dim, self.num_heads, self.resolved_num_kv_heads
    head_dim = self.resolved_head_dim
    attention = dim * head_dim * (2 * heads + 2 * kv_heads)  # q and out; k and v.
    if self.attention_bias:
      attention += head_dim * (heads + 2 * kv_heads) + dim
    # A query and a key norm: of one head's features, or of each head's.
    norm_width = 2 if self.norm == "layernorm" else 1
    return attention + {"none": 0, "head": 2 * head_dim,
                        "projection": (heads + kv_heads) * head_dim}[self.qk_norm] * norm_width

  @nn.nowrap
  def attention_matmul_parameters(self) -> int:
    """One layer's attention weight matrices (biases and norms excluded)."""
    return self.dim * self.resolved_head_dim * (
        2 * self.num_heads + 2 * self.resolved_num_kv_heads)  # q, out; k, v

  @nn.nowrap
  def attention_head_widths(self) -> int:
    """A query head's score width plus its value width (the attention FLOPs' factor)."""
    return 2 * self.resolved_head_dim

  @nn.nowrap
  def parameter_shapes(self) -> list[ArrayShape]:
    """Every parameter's path, logical axes, full shape and dtype, without allocating any.

    Traces a copy of `sample_layers()`: the unrolled prefix (models/transformer_layers.py)
    and one period P of the layers' variants (`layer_variants`: one layer unless the kinds
    differ; every attention kind has the same shapes), since tracing all of them takes time
    in proportion to depth (forever, for an absurd depth). A parameter of the copy's
    `layer_j` stands for the layers `sample_layers` says: unrolled, as `layer_j` with that
    many `repeats`; scanned, the `layers` subtree with its leading axis at full size (groups
    of a pattern: `layers/pattern_j`), and the layers before and after the scanned ones
    unrolled.
    """
    count, stands_for = self.sample_layers()
    sample = self.clone(parent=None, scan_layers=False, **self.variant_fields(count))
    tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    boxed = jax.eval_shape(sample.init, jax.random.key(0), tokens)["params"]
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(
        boxed, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))[0]:
      value = leaf.value if isinstance(leaf, nn.meta.AxisMetadata) else leaf
      axes = tuple(getattr(leaf, "names", (None,) * len(value.shape)))
      shape, dtype = tuple(value.shape), jnp.dtype(value.dtype)
      first = getattr(path[0], "key", "")
      if not first.startswith("layer_"):
        found.append(ArrayShape(jax.tree_util.keystr(path), axes, shape, dtype))
        continue
      layers = stands_for[int(first[len("layer_"):])]
      found += self._layer_shapes(layers, jax.tree_util.keystr(path[1:]), axes, shape, dtype)
    return found

  @nn.nowrap
  def _layer_shapes(self, layers: range, inner: str, axes: tuple[str | None, ...],
                    shape: tuple[int, ...], dtype: Any) -> list[ArrayShape]:
    """A parameter (`inner`: its path in a block) of `layers` (one variant's) as the stack
    keeps it: stacked where scanned, else one `layer_N` standing for its repeats."""
    start, stop = self.scanned_span()
    scanned = _within(layers, start, stop)
    found = []
    if scanned:
      period, groups = self.scan_plan()
      if period == 1:
        found.append(ArrayShape(f"['layers']{inner}", ("layers", *axes),
                                (stop - start, *shape), dtype))
      else:
        found.append(ArrayShape(f"['layers']['pattern_{(scanned[0] - start) % period}']{inner}",
                                ("layers", *axes), (groups, *shape), dtype))
    # The prefix, or the layers left over (one each side: a repeat per layer); unscanned, the
    # span is (0, 0) and every layer is "left over".
    found += [ArrayShape(f"['layer_{side[0]}']{inner}", axes, shape, dtype, len(side))
              for side in (_within(layers, layers.start, start),
                           _within(layers, stop, layers.stop)) if side]
    return found

  @nn.nowrap
  def matmul_parameters(self) -> int:
    """Weights that multiply activations once per token (biases, norms, embedding excluded;
    the unembedding, tied or not, included)."""
    return self.block_matmul_parameters() + self.dim * self.vocab_size

  @nn.nowrap
  def block_matmul_parameters(self) -> int:
    """The blocks' weight matrices (what "int8" training quantizes)."""
    mlp_inputs = 2 if self.mlp_activation in layers.GATED_ACTIVATIONS else 1
    mlp = (mlp_inputs + 1) * self.dim * self.resolved_mlp_dim
    return self.num_layers * (self.attention_matmul_parameters() + mlp)

  @nn.nowrap
  def size_fields(self) -> dict[str, int]:
    return {name: getattr(self, name) for name in _SIZE_FIELDS
            if getattr(self, name) is not None
            and (name != "max_length" or self.position == "learned")}

  # ---------------------------------------------------------------------------- FLOPs

  @nn.nowrap
  def _layers_by_window(self) -> tuple[int, int]:
    """(layers that see every earlier position, layers that see the last `window`)."""
    sliding = transformer_layers.count_per_layer(self.layer_kinds, self.num_layers, "sliding")
    return self.num_layers - sliding, sliding

  @nn.nowrap
  def attention_flops_per_token(self, sequence_length: int) -> int | float:
    """Scores and weighted values: 4 T H d per token and layer, halved for causality (a token
    sees the positions up to its own, half of the sequence on average): an int, so that
    MFU's count stays exact. A sliding layer counts only the pairs inside its band: the
    causal count less the (T - W)^2 / 2 pairs outside it, W T - W^2 / 2 pairs, W - W^2 / 2T
    per token (a window of at least the sequence is the causal count exactly)."""
    full, sliding = self._layers_by_window()
    length, window = sequence_length, self.window
    per_layer = self.num_heads * self.attention_head_widths()  # 2 H d: scores and values.
    if not sliding or length <= window:
      return self.num_layers * length * per_layer
    return (full * length * per_layer
            + sliding * 2 * per_layer * (window - window * window / (2 * length)))

  @nn.nowrap
  def decode_attention_flops(self, context_length: int) -> int:
    """One new token's scores and weighted values against `context_length` positions (a
    sliding layer's against its window at most, however long the context)."""
    full, sliding = self._layers_by_window()
    per_position = 2 * self.num_heads * self.attention_head_widths()
    seen = context_length if not sliding else min(context_length, self.window)
    return per_position * (full * context_length + sliding * seen)


def _within(layers: range, low: int, high: int) -> range:
  """The layers of `layers` in [low, high), as a range: counted, never listed (a billion
  layers' depth is refused by what counts them, not waited for)."""
  first = max(0, -(-(low - layers.start) // layers.step))
  last = max(0, -(-(high - layers.start) // layers.step))
  return layers[first:last]

