"""The decoder-only transformer LM that every transformer family shares.

`TransformerLM` is the transformer of every family built on it, and implements the family
interface (models/family.py) for all of them. The families differ in orthogonal choices, each
a field here; a family's module (models/gptj.py, llama.py, gpt2.py, mistral.py, qwen3.py,
gemma3.py, olmo3.py) is a subclass whose defaults are its choices:

| choice         | GPT-J                  | Llama                  | GPT-2            |
|----------------|------------------------|------------------------|------------------|
| block          | parallel (one norm)    | sequential (two norms) | sequential       |
| norm           | layernorm              | rmsnorm                | layernorm        |
| mlp_activation | gelu_tanh              | swiglu                 | gelu_tanh        |
| position       | rotary, interleaved,   | rotary, half,          | learned          |
|                | first 64 of 256 dims   | all dims               |                  |
| biases         | MLP, embedding, output | none                   | all              |
| tie_embeddings | no                     | no                     | yes              |

Mistral is Llama with every layer "sliding" (`layer_kinds`); Qwen3 is Llama with a query and
key RMSNorm per head (`qk_norm`) and a head width of its own. The fields from `layer_kinds` to
`embedding_scale` (attention kinds layer by layer with their own rotary settings, sandwich and
post-norm blocks, (1 + weight) RMSNorm, a query and key RMSNorm, a query scale and an
embedding scale of their own) are what Gemma 3 (5 sliding : 1 global, sandwich norms, GeGLU)
and OLMo 3 (3 sliding : 1 full, norms after attention and MLP) add; their modules list their
choices.

Every family's defaults for the token embedding's initialization (normal, stddev 0.02) and a
tied output (logits = h @ E^T, unscaled) are the references'; the bench shapes keep their
PaLM-style unit-scale rows and 1/sqrt(dim) through their experiment.

Derived sizes default to None and are computed where used (`head_dim = dim // num_heads`,
`mlp_dim = 4 * dim`, ...), so overriding `dim` from the command line keeps them consistent.
A config naming `TransformerLM` itself (an older job's config.json) builds the same model as
the family class with the same fields.

The family interface's answers about sizes and FLOPs (models/transformer_sizes.py), about
checks, the attention kernel and `tiny` (models/transformer_checks.py) and the layer stack with
its attention kinds, scanning and decode cache (models/transformer_layers.py) are mixins of the
class, reading its fields; its names in other weight formats are models/transformer_names.py's.
This module is the fields and the network's ends (embedding, output), its memory and layout
answers.

Longer than 300 lines with a reason: the fields' documentation is a third of it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.fields import Int32Size, NonNegativeInt, PositiveFloat, PositiveInt
from lingvo_lite.run_fields import RUN, TRAINING, Run
from lingvo_lite.models import attention_kernels, embedding_lookup, layers
from lingvo_lite.models.lora import LoraSettings
from lingvo_lite.models.pipeline import PipelineSettings
from lingvo_lite.models import quantization as quantizing
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.family import LanguageModel
from lingvo_lite.models.remat import RematPolicy
from lingvo_lite.models.rotary import positions_from_segments
from lingvo_lite.models.transformer_checks import TransformerChecks
from lingvo_lite.models.multi_token import MultiTokenPrediction
from lingvo_lite.models.transformer_layers import LayerKind, TransformerLayers
from lingvo_lite.models.transformer_sizes import TransformerSizes

PositionKind = Literal["rotary", "learned", "none"]
RotaryScaling = Literal["none", "llama3", "linear", "yarn"]
EmbeddingScale = Literal["one", "sqrt_dim"]
TiedOutputScale = Literal["one", "rsqrt_dim"]
__all__ = ["TransformerLM", "positions_from_segments"]


class TransformerLM(TransformerSizes, TransformerChecks, TransformerLayers, MultiTokenPrediction,
                    LanguageModel):
  """Decoder-only transformer LM: tokens [batch, length] -> float32 logits [batch, length, vocab].

  The fields of how the model is run or trained are marked `RUN` / `TRAINING` (run_fields.py):
  weight formats leave them out, `--init_from` keeps the experiment's, a resume may change
  them (the dtypes excepted).

  Attributes:
    vocab_size: Size of the output softmax (may include padding rows, as GPT-J's 50400).
    num_layers: Number of transformer blocks.
    dim: Model (residual stream) width.
    num_heads: Query heads.
    num_kv_heads: Key/value heads for grouped-query attention; None means num_heads.
    head_dim: Per-head width; None means dim // num_heads.
    mlp_dim: Hidden width of the MLP; None means 4 * dim.
    block: Where the norms sit: "parallel" (GPT-J: x + attn(ln x) + mlp(ln x)),
      "sequential" (pre-norm), "sandwich" (Gemma: before and after attention and MLP) or
      "post_norm" (OLMo 2 and 3: after them only); models/block.py.
    norm: "layernorm", "rmsnorm", or "rmsnorm_plus_one" (Gemma's: the scale is 1 + a
      learned weight that starts at 0).
    norm_eps: Epsilon of every norm.
    mlp_activation: gelu_tanh, gelu, relu, swiglu or geglu.
    position: "rotary", "learned" (absolute table of max_length rows) or "none".
    rotary_dim: Dims of each head that rotate; None means all of head_dim.
    rotary_style: "interleaved" (GPT-J) or "half" (Llama, NeoX).
    rotary_base: Base of the rotary frequencies (of the full-attention layers, and of the
      sliding ones unless `sliding_rotary_base` says otherwise).
    rotary_scaling: "none"; "llama3": Llama 3.1's rescaled frequencies for a context longer
      than trained (factor, low and high frequency factors, original length); "linear":
      every frequency divided by the factor (Gemma 3 4B and up); "yarn": YaRN's blend
      (factor, original length, beta fast and slow, attention factor): models/rotary.py.
    rotary_scaling_factor, rotary_low_freq_factor, rotary_high_freq_factor,
      rotary_original_max_length: Hugging Face's `rope_scaling` settings (Llama 3.1's: 8, 1,
      4, 8192).
    rotary_beta_fast, rotary_beta_slow: YaRN's correction range (32 and 1).
    rotary_attention_factor: YaRN's factor of sin and cos; None: 0.1 ln(factor) + 1.
    rotary_truncate: YaRN's correction range rounded to whole dimensions (Hugging Face's
      `truncate`, true by default; gpt-oss's config sets false).
    layer_kinds: Each layer's attention kind, a pattern repeated over the layers: "full"
      (every earlier position), "sliding" (the last `window`), "no_rotary" (every earlier
      position, no rotary positions); models/transformer_layers.py.
    window: Positions a sliding layer's query sees, its own included; the decode cache holds
      min(window, cache_length) of them for such a layer.
    sliding_rotary_base, sliding_rotary_scaling: The sliding layers' own rotary base and
      scaling kind (Gemma 3's local layers: base 10000, no scaling); None: the full layers'.
    qk_norm: "none", or an RMSNorm (of `norm`'s kind) of queries and keys before the rotary
      positions: "head" (each head's features: Qwen3, Gemma 3) or "projection" (the whole
      projection: OLMo 2 and 3).
    query_pre_attention_scalar: Queries are multiplied by its inverse square root (Gemma's
      `query_pre_attn_scalar`); None: 1/sqrt(head_dim).
    embedding_scale: "one", or "sqrt_dim": embedding rows multiplied by sqrt(dim), the factor
      rounded to the compute dtype as Gemma's reference rounds it.
    max_length: The model's context: rows of the learned position table, and the positions
      a decode request may reach (decode.cache_length's default).
    attention_bias: Bias on q, k, v and output projections.
    attention_implementation: A kernel of models/attention_kernels/ ("einsum": written out,
      "xla", "cudnn", "splash", "paged": the TPU's decode kernel), or "auto" (the default: the
      target's fastest that takes the model, resolved when the model is traced: "splash" on
      TPUs, "cudnn" or "xla" on GPUs, "einsum" on CPUs).
    mlp_bias: Bias on the MLP projections.
    embedding_bias: A learned bias added to every token embedding (mesh-transformer-jax
      implements the embedding as one-hot times a biased Linear).
    tie_embeddings: Reuse the token embedding as the output projection.
    tied_output_scale: What the tied output projection multiplies the final norm's output by
      before the embedding's transpose: "one" (logits = h @ E^T, as GPT-2 and Llama compute
      them, and so what their pretrained weights expect), or "rsqrt_dim" (1/sqrt(dim): a
      PaLM-style choice that keeps the logits of unit-scale embedding rows O(1)).
    embedding_init_stddev: Standard deviation of the token embedding's normal initialization
      (GPT-2, GPT-J and Llama use 0.02, their `initializer_range`; 1.0 suits "rsqrt_dim").
    output_bias: Bias on the untied output projection.
    quantization: None, "int8" (training: the blocks' weight matmuls in int8, forward and
      backward) or "int8_weights" (decoding: every weight matrix stored in int8); see
      models/quantization.py.
    dtype: Activation dtype name.
    param_dtype: Parameter dtype name.
    scan_layers: Run the blocks as one `nn.scan` (compile time independent of depth);
      parameters then have a leading layer axis, so checkpoints differ in layout.
    remat_policy: What the backward pass may keep from the forward of each block: "none"
      (keep everything, no recomputation), "full" (keep nothing, recompute the block),
      JAX's "dots_saveable" and "dots_with_no_batch_dims_saveable", or a policy over the
      blocks' named activations ("minimal", "save_qkv_proj", "save_attention", ...,
      "*_offloaded" to host memory): models/remat.py lists them.
    lora: The LoRA adapters' settings (models/lora.py). Set by the programs from
      `train.lora` (`with_adapters`), never by a config: leave it None.
    pipeline: The pipeline the scanned stack runs as (models/pipeline.py). Set by the
      programs from the partitioner's stage axis and `train.pipeline_*` (`with_pipeline`),
      never by a config: leave it None.
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
  rotary_scaling: RotaryScaling = "none"
  rotary_scaling_factor: PositiveFloat = 8.0
  rotary_low_freq_factor: PositiveFloat = 1.0
  rotary_high_freq_factor: PositiveFloat = 4.0
  rotary_original_max_length: PositiveInt = 8192
  rotary_beta_fast: PositiveFloat = 32.0
  rotary_beta_slow: PositiveFloat = 1.0
  rotary_attention_factor: PositiveFloat | None = None
  rotary_truncate: bool = True
  layer_kinds: tuple[LayerKind, ...] = ("full",)
  window: PositiveInt | None = None
  sliding_rotary_base: PositiveFloat | None = None
  sliding_rotary_scaling: RotaryScaling | None = None
  qk_norm: layers.QkNorm = "none"
  query_pre_attention_scalar: PositiveFloat | None = None
  embedding_scale: EmbeddingScale = "one"
  max_length: Annotated[int, Int32Size] = 2048
  attention_bias: bool = False
  attention_implementation: Annotated[attention_kernels.AttentionImplementation, RUN] = "auto"
  mlp_bias: bool = False
  embedding_bias: bool = False
  tie_embeddings: bool = False
  tied_output_scale: TiedOutputScale = "one"
  embedding_init_stddev: Annotated[PositiveFloat, TRAINING] = 0.02
  output_bias: bool = False
  quantization: Annotated[quantizing.Quantization | None, RUN] = None
  dtype: Annotated[layers.DType, Run(resumable=False)] = "float32"
  param_dtype: Annotated[layers.DType, Run(resumable=False)] = "float32"
  scan_layers: Annotated[bool, RUN] = False
  remat_policy: Annotated[RematPolicy, RUN] = "none"
  lora: LoraSettings | None = None
  pipeline: PipelineSettings | None = None

  quantizations = quantizing.QUANTIZATIONS

  @classmethod
  def former_defaults(cls, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Before `embedding_init_stddev` and `tied_output_scale` existed, embedding rows had unit
    scale and a tied output was scaled by 1/sqrt(dim) (an untied model is left alone: its
    config compares equal to today's)."""
    former = {"embedding_init_stddev": 1.0}
    if arguments.get("tie_embeddings", cls.tie_embeddings):
      former["tied_output_scale"] = "rsqrt_dim"
    return former

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

  # ---------------------------------------------------------------------------- axes

  @classmethod
  def logical_axes(cls) -> dict[str, str]:
    return {"embed": "dim", "mlp": "mlp_dim", "heads": "num_heads", "kv": "head_dim",
            "vocab": "vocab_size", "norm": "dim", "position": "max_length",
            "layers": "num_layers"}

  # ---------------------------------------------------------------------------- memory

  @nn.nowrap
  def attention_scores_shape(self, rows: int, length: int
                             ) -> tuple[tuple[int, ...], tuple[str | None, ...]]:
    # "bhts", as the einsum of models/layers.py writes them out.
    return (rows, self.num_heads, length, length), ("batch", "heads", "length", None)

  # ---------------------------------------------------------------------------- layout

  @nn.nowrap
  def layout_metadata(self) -> dict[str, Any]:
    return {"scan_layers": bool(self.scan_layers), "num_layers": int(self.num_layers)}

  @nn.nowrap
  def in_saved_layout(self, metadata: Mapping[str, Any]) -> TransformerLM | None:
    saved_scan = metadata.get("scan_layers")
    if saved_scan is None or saved_scan == self.scan_layers:
      return None
    return self.clone(parent=None, scan_layers=saved_scan)

  @nn.nowrap
  def for_decoding(self, platform: str) -> TransformerLM:
    """Scanned layers decode unrolled on accelerators: a loop iteration per layer and token
    made each decode step 2.2x slower at batch 1 on a TPU v5e (SmolLM2-135M's shape; README,
    "Measured on a TPU v5e"), and an unrolled decode step of its 30 layers compiled there in
    22 s. The parameters are sliced into layers once, when loaded. On a CPU the loop costs
    nothing measurable and keeps one block's compile."""
    if self.scan_layers and platform != "cpu":
      return self.clone(parent=None, scan_layers=False)
    return self

  # ---------------------------------------------------------------------------- int8 weights

  @classmethod
  def int8_weight_contractions(cls) -> dict[tuple[str, ...], tuple[str, ...]]:
    return {("embed", "heads", "kv"): ("embed",),       # query, key and value projections
            ("heads", "kv", "embed"): ("heads", "kv"),  # the attention's output projection
            ("embed", "mlp"): ("embed",),               # the MLP's input (and gate)
            ("mlp", "embed"): ("mlp",),                 # and output
            ("embed", "vocab"): ("embed",),             # the untied output projection
            ("vocab", "embed"): ("embed",)}             # the embedding: rows, or tied output

  # ---------------------------------------------------------------------------- LoRA

  @nn.nowrap
  def with_adapters(self, settings: LoraSettings | None) -> TransformerLM:
    """This model with LoRA adapters on the weight matrices `settings` target (models/lora.py):
    its `lora` variables are the adapters; applied without them it is this model."""
    return self.clone(parent=None, lora=settings)

  @nn.nowrap
  def with_pipeline(self, settings: PipelineSettings | None) -> TransformerLM:
    """This model with its scanned stack run as `settings`' pipeline (models/pipeline.py):
    the same parameters, the same function."""
    return self.clone(parent=None, pipeline=settings)

  # ---------------------------------------------------------------------------- the network

  @nn.nowrap
  def attention_module(self) -> tuple[type[layers.Attention], dict[str, Any]]:
    """The attention layer of every block, and the values of its fields beyond the shared
    sizes: a family with other attention returns its subclass and their values."""
    return layers.Attention, {}

  @nn.nowrap
  def mlp_module(self, kind: str) -> tuple[Any, dict[str, Any]]:
    """The feed-forward layer of a block of feed-forward `kind` (`mlp_kinds_by_layer`) and
    its fields beyond the quantization and dtypes: (None, {}) for the shared `layers.Mlp` of
    the `mlp_*` fields; a family with another layer returns its class and fields."""
    del kind
    return None, {}

  @nn.nowrap
  def _block_fields(self, kind: str, mlp_kind: str = "dense") -> dict:
    """`block.Block`'s fields for a layer of attention `kind` and feed-forward `mlp_kind`."""
    mlp_type, mlp_options = self.mlp_module(mlp_kind)
    attention_type, options = self.attention_module()
    query_scale = (None if self.query_pre_attention_scalar is None
                   else self.query_pre_attention_scalar ** -0.5)
    return dict(
        kind=self.block, norm_kind=self.norm, norm_eps=self.norm_eps, num_heads=self.num_heads,
        num_kv_heads=self.resolved_num_kv_heads, head_dim=self.resolved_head_dim,
        attention_bias=self.attention_bias, rotary_style=self.rotary_style,
        **self.kind_fields(kind), query_scale=query_scale, qk_norm=self.qk_norm,
        attention_implementation=self.resolved_attention_implementation(),
        mlp_dim=self.resolved_mlp_dim, mlp_activation=self.mlp_activation, mlp_bias=self.mlp_bias,
        quantization=self.quantization, lora=self.lora, dtype=jnp.dtype(self.dtype),
        param_dtype=jnp.dtype(self.param_dtype),
        attention_type=attention_type, attention_options=tuple(sorted(options.items())),
        cache_layout=self.cache_layout(),
        mlp_type=mlp_type, mlp_options=tuple(sorted(mlp_options.items())))

  @nn.compact
  def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, cache: Any = None,
               output_index: jax.Array | None = None, return_kv: bool = False,
               multi_token: bool = False) -> Any:
    """Logits of `tokens` [batch, length]; see the class doc.

    Decoding uses the last three arguments (lingvo_lite/decode/steps.py):

    Args:
      cache: A decode cache (keys, values) of every layer (models/kv_cache.py): tuples of
        arrays in the model's `cache_layout()` ([batch, kv_heads, entries, head_dim] or
        [batch, entries, kv_heads * head_dim]), or stacked arrays with scanned layers.
        Each block's attention writes the tokens' keys and values for their `positions`
        (required) and attends to what the row holds up to each token's own position
        (`layers.Attention._cached_attention`, or a family's own); returns `(logits, cache)`.
      output_index: int32 [batch]: only the logits at this index of each row, [batch, 1,
        vocab] (a prefill needs the last prompt token's alone, not the whole vocabulary
        projection of every position).
      return_kv: Also return the tokens' keys and values (a prefill's, for the cache),
        [layers, batch, length, kv_heads, head_dim] each: `(logits, (keys, values))`.
      multi_token: Also the multi-token modules' logits (training: models/multi_token.py),
        [depths, batch, length, vocab]: `(logits, those)`.
    """
    if positions is None:
      length = tokens.shape[1]
      positions = (positions_from_segments(segment_ids) if segment_ids is not None
                   else jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape))
    x, embedding = self._embedded(tokens, positions, decoding_step=cache is not None)
    x, extra = self._layers(x, positions, segment_ids, cache, return_kv)
    if output_index is not None:
      x = jnp.take_along_axis(x, output_index.astype(jnp.int32)[:, None, None], axis=1)
    depth = self.multi_token_depth() if (multi_token or self.is_initializing()) else 0
    ahead = None
    if depth and output_index is None and cache is None:  # models/multi_token.py
      ahead = lambda normed: self._multi_token_hidden(normed, tokens, positions, segment_ids,
                                                      embedding)
    logits = self._logits(x, embedding, ahead)
    if ahead is not None:  # The main rows, then each depth's: [D, B, T, vocab].
      rows = tokens.shape[0]
      logits, extra = logits[:rows], logits[rows:].reshape(depth, rows, *logits.shape[1:])
      return (logits, extra) if multi_token else logits
    return (logits, extra) if (return_kv or cache is not None) else logits

  def _embedded(self, tokens: jax.Array, positions: jax.Array, decoding_step: bool = False
                ) -> tuple[jax.Array, Any]:
    """The tokens' embeddings [batch, length, dim] in the compute dtype (scaled, biased and
    positioned as the fields say), and the embedding table (quantized under "int8_weights")
    that a tied output reads."""
    dtype, param_dtype = jnp.dtype(self.dtype), jnp.dtype(self.param_dtype)
    embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=self.embedding_init_stddev),
                                     ("vocab", "embed")),
        (self.vocab_size, self.dim), param_dtype)
    if self.quantization == "int8_weights" and not quantizing.is_quantized(embedding):
      # Float weights under "int8_weights" (an eval, say): the lookup and the tied output read
      # the table's int8 rows as decoding's quantized parameters hold them.
      embedding = quantizing.quantize(embedding, contracted=(1,))
    # Its gradient built in the table's shards (models/embedding_lookup.py), but not for an int8
    # table (no gradient) or a cached decoding step, which would cast the whole table each step.
    if quantizing.is_quantized(embedding) or decoding_step:
      x = quantizing.take_rows(jax.tree.map(lambda a: layers.constrain(a, None, None), embedding),
                               tokens, dtype)
    else:
      x = embedding_lookup.rows(embedding, tokens, dtype)
    if self.embedding_scale == "sqrt_dim":
      # Rounded to the compute dtype first, as Gemma's reference rounds it to its weights'.
      x = x * jnp.asarray(math.sqrt(self.dim), dtype)
    if self.embedding_bias:
      x = x + self.param("embedding_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("embed",)), (self.dim,), param_dtype).astype(dtype)
    if self.position == "learned":
      table = self.param(
          "position_embedding",
          nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), ("position", "embed")),
          (self.max_length, self.dim), param_dtype)
      x = x + jnp.take(table, positions, axis=0).astype(dtype)
    return layers.constrain(x, "batch", "length", "activation_embed"), embedding

  def _logits(self, x: jax.Array, embedding: Any, ahead: Any = None) -> jax.Array:
    """The final norm and the output projection (the embedding table's, where tied): float32
    logits [batch, length, vocab]."""
    dtype, param_dtype = jnp.dtype(self.dtype), jnp.dtype(self.param_dtype)
    x = layers.Norm(kind=self.norm, eps=self.norm_eps, dtype=dtype, name="final_norm")(x)
    if ahead is not None:  # The multi-token rows after the main ones: one shared projection.
      x = jnp.concatenate([x, ahead(x)], axis=0)
    # "int8" training quantizes the blocks only; "int8_weights" the output projection too.
    output_quantization = "int8_weights" if self.quantization == "int8_weights" else None
    if self.tie_embeddings:
      if self.tied_output_scale == "rsqrt_dim":
        # Scaling x rather than the logits touches dim, not vocab, values per token.
        x = x * jnp.asarray(1.0 / math.sqrt(self.dim), dtype)
      if output_quantization:
        logits = quantizing.dot_general(x, layers.in_compute_dtype(embedding, dtype),
                                        (((2,), (1,)), ((), ())), output_quantization)
      else:
        logits = jnp.einsum("btd,vd->btv", x, embedding.astype(dtype))
    else:
      logits = layers.Dense(
          self.vocab_size, kernel_axes=("embed", "vocab"), use_bias=self.output_bias,
          quantization=output_quantization, lora=self.lora, dtype=dtype,
          param_dtype=param_dtype, name="output")(x)
    return layers.constrain(logits, "batch", "length", "vocab").astype(jnp.float32)
