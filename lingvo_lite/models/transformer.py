"""A decoder-only transformer language model covering the GPT-J, Llama and GPT-2 families.

The families differ in a handful of orthogonal choices, each a field here:

| choice            | GPT-J                    | Llama                  | GPT-2            |
|-------------------|--------------------------|------------------------|------------------|
| block             | parallel (one norm)      | sequential (two norms) | sequential       |
| norm              | layernorm                | rmsnorm                | layernorm        |
| mlp_activation    | gelu_tanh                | swiglu                 | gelu_tanh        |
| position          | rotary, interleaved,     | rotary, half,          | learned          |
|                   | first 64 of 256 dims     | all dims               |                  |
| biases            | MLP, embedding, output   | none                   | all              |
| tie_embeddings    | no                       | no                     | yes              |

Derived sizes default to None and are computed where used (`head_dim = dim // num_heads`,
`mlp_dim = 4 * dim`, ...), so overriding `dim` from the command line keeps them consistent.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.fields import Int32Size, NonNegativeInt, PositiveFloat, PositiveInt
from lingvo_lite.models import layers

BlockKind = Literal["parallel", "sequential"]
PositionKind = Literal["rotary", "learned", "none"]
RematPolicy = Literal["none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable"]

REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def positions_from_segments(segment_ids: jax.Array) -> jax.Array:
  """Position of each token within its segment (restarts at 0 where the segment changes)."""
  length = segment_ids.shape[-1]
  index = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), segment_ids.shape)
  starts = jnp.concatenate(
      [jnp.ones_like(segment_ids[:, :1], dtype=jnp.bool_),
       segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
  segment_start = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
  return index - segment_start


@dataclasses.dataclass(frozen=True)
class ParameterShape:
  """One parameter of a model, as shapes only (see `TransformerLM.parameter_shapes`).

  Attributes:
    path: Where it lives in the parameter tree, as `jax.tree_util.keystr` writes it.
    axes: Logical axis name of each dimension (None for unnamed).
    shape: Its full shape.
    dtype: Its dtype.
    repeats: How many parameters of this path and shape the model has (one per layer for a
      parameter of an unrolled layer).
  """

  path: str
  axes: tuple[str | None, ...]
  shape: tuple[int, ...]
  dtype: jnp.dtype
  repeats: int = 1


class Block(nn.Module):
  """One transformer layer, parallel (GPT-J) or sequential (pre-norm GPT-2 / Llama).

  Takes its own sizes as plain fields so `nn.scan` and `nn.remat` can lift it as a class.
  With `scan_carry` it returns `(x, None)`, the (carry, output) pair `nn.scan` expects; with
  `return_kv`, `(x, kv)`: also the layer's new keys and values (for a decoder's cache).
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
  attention_implementation: layers.AttentionImplementation
  mlp_dim: int
  mlp_activation: layers.Activation
  mlp_bias: bool
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  scan_carry: bool = False
  return_kv: bool = False

  def _norm(self, name: str) -> layers.Norm:
    return layers.Norm(kind=self.norm_kind, eps=self.norm_eps, dtype=self.dtype,
                       param_dtype=self.param_dtype, name=name)

  @nn.compact
  def __call__(self, x: Any, positions: jax.Array, mask: jax.Array | None, layer: Any = None):
    """`x` [batch, length, dim]; when decoding, the pair (x, cache): this layer's decode
    cache (keys, values), or with `layer` (inside a scan) every layer's stacked, this one at
    index `layer`. Returns x, or (x, kv) with `return_kv`, or (x, cache) when decoding; as
    the carry of a pair with `scan_carry`."""
    cache = None
    if isinstance(x, tuple):
      x, cache = x
    context = None if cache is None else layers.Context(*cache, layer)
    attention = layers.Attention(
        num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
        use_bias=self.attention_bias, rotary_dim=self.rotary_dim,
        rotary_style=self.rotary_style, rotary_base=self.rotary_base,
        implementation=self.attention_implementation, dtype=self.dtype,
        param_dtype=self.param_dtype, name="attention")
    mlp = layers.Mlp(mlp_dim=self.mlp_dim, activation=self.mlp_activation,
                     use_bias=self.mlp_bias, dtype=self.dtype, param_dtype=self.param_dtype,
                     name="mlp")
    extra = None  # What attention returns besides its output: new kv, or the cache.
    wants_extra = self.return_kv or context is not None
    if self.kind == "parallel":
      h = self._norm("norm")(x)
      attended = attention(h, positions, mask, context, self.return_kv)
      if wants_extra:
        attended, extra = attended
      x = x + attended + mlp(h)
    else:
      attended = attention(self._norm("attention_norm")(x), positions, mask, context,
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


class TransformerLM(nn.Module):
  """Decoder-only transformer LM: tokens [batch, length] -> float32 logits [batch, length, vocab].

  Attributes:
    vocab_size: Size of the output softmax (may include padding rows, as GPT-J's 50400).
    num_layers: Number of transformer blocks.
    dim: Model (residual stream) width.
    num_heads: Query heads.
    num_kv_heads: Key/value heads for grouped-query attention; None means num_heads.
    head_dim: Per-head width; None means dim // num_heads.
    mlp_dim: Hidden width of the MLP; None means 4 * dim.
    block: "parallel" (GPT-J: x + attn(ln x) + mlp(ln x)) or "sequential" (pre-norm).
    norm: "layernorm" or "rmsnorm".
    norm_eps: Epsilon of every norm.
    mlp_activation: gelu_tanh, gelu, relu, swiglu or geglu.
    position: "rotary", "learned" (absolute table of max_length rows) or "none".
    rotary_dim: Dims of each head that rotate; None means all of head_dim.
    rotary_style: "interleaved" (GPT-J) or "half" (Llama, NeoX).
    rotary_base: Base of the rotary frequencies.
    max_length: Rows of the learned position table.
    attention_bias: Bias on q, k, v and output projections.
    attention_implementation: "einsum" (written out, the default), or
      jax.nn.dot_product_attention's "xla" or "cudnn" (flash attention; NVIDIA GPUs only).
    mlp_bias: Bias on the MLP projections.
    embedding_bias: A learned bias added to every token embedding (mesh-transformer-jax
      implements the embedding as one-hot times a biased Linear).
    tie_embeddings: Reuse the token embedding as the output projection.
    output_bias: Bias on the untied output projection.
    dtype: Activation dtype name.
    param_dtype: Parameter dtype name.
    scan_layers: Run the blocks as one `nn.scan` (compile time independent of depth);
      parameters then have a leading layer axis, so checkpoints differ in layout.
    remat_policy: What the backward pass may keep from the forward of each block: "none"
      (keep everything, no recomputation), "full" (keep nothing, recompute the block),
      "dots_saveable" (keep matmul outputs), "dots_with_no_batch_dims_saveable" (keep
      weight matmuls, recompute attention scores).
  """

  vocab_size: Annotated[int, Int32Size]
  num_layers: PositiveInt
  dim: PositiveInt
  num_heads: PositiveInt
  num_kv_heads: PositiveInt | None = None
  head_dim: PositiveInt | None = None
  mlp_dim: PositiveInt | None = None
  block: BlockKind = "sequential"
  norm: layers.NormKind = "layernorm"
  norm_eps: PositiveFloat = 1e-5
  mlp_activation: layers.Activation = "gelu_tanh"
  position: PositionKind = "rotary"
  rotary_dim: NonNegativeInt | None = None
  rotary_style: layers.RotaryStyle = "half"
  rotary_base: PositiveFloat = 10000.0
  max_length: Annotated[int, Int32Size] = 2048
  attention_bias: bool = False
  attention_implementation: layers.AttentionImplementation = "einsum"
  mlp_bias: bool = False
  embedding_bias: bool = False
  tie_embeddings: bool = False
  output_bias: bool = False
  dtype: layers.DType = "float32"
  param_dtype: layers.DType = "float32"
  scan_layers: bool = False
  remat_policy: RematPolicy = "none"

  # Derived sizes, computed where used (DESIGN rule 3).
  @property
  def resolved_num_kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim or self.dim // self.num_heads

  @property
  def resolved_mlp_dim(self) -> int:
    return self.mlp_dim or 4 * self.dim

  @property
  def resolved_rotary_dim(self) -> int:
    if self.position != "rotary":
      return 0
    return self.rotary_dim if self.rotary_dim is not None else self.resolved_head_dim

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

  def parameter_shapes(self) -> list[ParameterShape]:
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
      found.append(ParameterShape(jax.tree_util.keystr(path), axes, shape,
                                  jnp.dtype(value.dtype), repeats))
    return found

  def _block_fields(self) -> dict:
    return dict(
        kind=self.block, norm_kind=self.norm, norm_eps=self.norm_eps, num_heads=self.num_heads,
        num_kv_heads=self.resolved_num_kv_heads, head_dim=self.resolved_head_dim,
        attention_bias=self.attention_bias, rotary_dim=self.resolved_rotary_dim,
        rotary_style=self.rotary_style, rotary_base=self.rotary_base,
        attention_implementation=self.attention_implementation,
        mlp_dim=self.resolved_mlp_dim, mlp_activation=self.mlp_activation, mlp_bias=self.mlp_bias,
        dtype=jnp.dtype(self.dtype), param_dtype=jnp.dtype(self.param_dtype))

  def _layers(self, x: jax.Array, positions: jax.Array, mask: jax.Array | None,
              cache: Any = None, return_kv: bool = False) -> tuple[jax.Array, Any]:
    """The stack of blocks: unrolled (`layer_0`, ...) or one scanned `layers` module whose
    parameters carry a leading axis of num_layers (logical axis `layers`).

    Returns the output and: with a decode `cache` (keys, values), the cache with the new
    tokens written; with `return_kv`, every layer's new (keys, values) stacked on a leading
    layer axis; else None.
    """
    block_class = Block
    if self.remat_policy != "none":
      block_class = nn.remat(block_class, policy=REMAT_POLICIES[self.remat_policy],
                             prevent_cse=not self.scan_layers)
    fields = dict(self._block_fields(), return_kv=return_kv and cache is None)
    if not self.scan_layers:
      new_kv = []
      layer_caches = [] if cache is None else list(zip(*cache))
      for index in range(self.num_layers):
        block = block_class(**fields, name=f"layer_{index}")
        if cache is not None:
          x, layer_caches[index] = block((x, layer_caches[index]), positions, mask)
          continue
        out = block(x, positions, mask)
        x, kv = out if return_kv else (out, None)
        new_kv.append(kv)
      if cache is not None:
        return x, tuple(tuple(layer) for layer in zip(*layer_caches))
      return x, (jax.tree.map(lambda *kvs: jnp.stack(kvs), *new_kv) if return_kv else None)
    stack = nn.scan(block_class, variable_axes={"params": 0}, split_rngs={"params": True},
                    in_axes=(nn.broadcast, nn.broadcast, 0), length=self.num_layers,
                    metadata_params={nn.PARTITION_NAME: "layers"})
    scanned = stack(**fields, scan_carry=True, name="layers")
    layer_index = jnp.arange(self.num_layers, dtype=jnp.int32)
    if cache is not None:
      (x, cache), _ = scanned((x, cache), positions, mask, layer_index)
      return x, cache
    return scanned(x, positions, mask, layer_index)

  @nn.compact
  def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, cache: Any = None,
               output_index: jax.Array | None = None, return_kv: bool = False) -> Any:
    """Logits of `tokens` [batch, length]; see the class doc.

    Decoding uses the last three arguments (lingvo_lite/decode/steps.py):

    Args:
      cache: A decode cache (keys, values) of every layer (models/kv_cache.py): tuples of
        [batch, kv_heads, cache_length, head_dim] arrays, or stacked arrays with scanned
        layers. The tokens' keys and values are written at their `positions` (required),
        and each token attends to the row's entries up to its own position; returns
        `(logits, cache)`.
      output_index: int32 [batch]: only the logits at this index of each row, [batch, 1,
        vocab] (a prefill needs the last prompt token's alone, not the whole vocabulary
        projection of every position).
      return_kv: Also return the tokens' keys and values (a prefill's, for the cache),
        [layers, batch, length, kv_heads, head_dim] each: `(logits, (keys, values))`.
    """
    dtype, param_dtype = jnp.dtype(self.dtype), jnp.dtype(self.param_dtype)
    batch, length = tokens.shape
    if positions is None:
      positions = (positions_from_segments(segment_ids) if segment_ids is not None
                   else jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape))

    embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0), ("vocab", "embed")),
        (self.vocab_size, self.dim), param_dtype)
    # Gather from the whole table, as FSDP does with every weight before use: from a sharded
    # table XLA cannot turn the gathered rows into batch-sharded activations efficiently and
    # replicates them instead ("involuntary full rematerialization").
    x = jnp.take(layers.constrain(embedding, None, None), tokens, axis=0).astype(dtype)
    if self.embedding_bias:
      x = x + self.param("embedding_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("embed",)), (self.dim,), param_dtype).astype(dtype)
    if self.position == "learned":
      table = self.param(
          "position_embedding",
          nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), ("position", "embed")),
          (self.max_length, self.dim), param_dtype)
      x = x + jnp.take(table, positions, axis=0).astype(dtype)
    x = layers.constrain(x, "batch", "length", "embed")

    # Without segments the mask is causal only, which fused attention kernels take as a flag.
    mask = layers.attention_mask(segment_ids, length) if segment_ids is not None else None
    x, extra = self._layers(x, positions, mask, cache, return_kv)
    if output_index is not None:
      x = jnp.take_along_axis(x, output_index.astype(jnp.int32)[:, None, None], axis=1)

    x = layers.Norm(kind=self.norm, eps=self.norm_eps, dtype=dtype, name="final_norm")(x)
    if self.tie_embeddings:
      # The embedding rows have unit scale; 1/sqrt(dim) keeps initial logits O(1). Scaling
      # x rather than the logits touches dim, not vocab, values per token.
      x = x * jnp.asarray(1.0 / math.sqrt(self.dim), dtype)
      logits = jnp.einsum("btd,vd->btv", x, embedding.astype(dtype))
    else:
      logits = nn.Dense(
          self.vocab_size, use_bias=self.output_bias, name="output", dtype=dtype,
          param_dtype=param_dtype, kernel_init=layers.dense_init(("embed", "vocab"), self.dim),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)))(x)
    logits = layers.constrain(logits, "batch", "length", "vocab").astype(jnp.float32)
    return (logits, extra) if (return_kv or cache is not None) else logits
