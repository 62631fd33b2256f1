"""Gemma 3 (the text model): five sliding-window layers to one global, Gemma's norms and GeGLU.

Choices, each a field of the shared transformer (models/transformer.py):

- layers: a pattern of five "sliding" (a window of 512 positions at 1B, 1024 above) then one
  "full" layer, repeated (26 layers at 1B: four patterns and two sliding layers); the
  sliding layers' rotary base is 10,000, the global ones' 1,000,000 (with a "linear" rotary
  scaling of 8 at 4B and above);
- "sandwich" blocks: an RMSNorm before and after both attention and MLP, each of
  "rmsnorm_plus_one" (the scale is 1 + a learned weight that starts at 0);
- an RMSNorm of each head's queries and keys before the rotary positions (`qk_norm="head"`);
- queries scaled by 1 / sqrt(query_pre_attn_scalar) (256 at 1B to 12B; the head width there);
- a GeGLU MLP with tanh GELU; embedding rows multiplied by sqrt(dim), the factor rounded to
  the compute dtype as the reference rounds it; the output tied to the embedding; no biases.

Hugging Face: `Gemma3ForCausalLM` (model_type "gemma3_text") is read and written. Gemma 3 4B
and larger ship as multimodal checkpoints (`Gemma3ForConditionalGeneration`, model_type
"gemma3"): their text model is read (its config from `text_config`, its tensors under
`language_model.`; the vision tower is left unread, named in one warning) and exported as a
text model. llama.cpp's GGUF architecture `gemma3` fixes the pattern (5:1), the sliding
layers' base (10,000) and the query scale (1/sqrt(head width), or 1/sqrt(width over heads) at
27B's 62 layers) and stores each norm as 1 + weight; a model it cannot express is refused.
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.errors import UsageError
from lingvo_lite.fields import PositiveFloat, PositiveInt
from lingvo_lite.models import dense_names, format_names, layers
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import Fixed, Rule
from lingvo_lite.models.dense_names import ATTENTION, QK_NORMS, norm, swiglu
from lingvo_lite.models.rope_names import per_kind_rope
from lingvo_lite.models.transformer import EmbeddingScale, RotaryScaling, TransformerLM
from lingvo_lite.models.transformer_layers import LayerKind, per_layer
from lingvo_lite.models.transformer_names import (TransformerGgufNames, TransformerHfNames,
                                                  sliding_pattern)

# Five sliding layers, then a global one: Hugging Face's `sliding_window_pattern` of 6.
PATTERN: tuple[LayerKind, ...] = ("sliding",) * 5 + ("full",)
# What llama.cpp's gemma3 fixes (its loader has no key for them).
_GGUF_SLIDING_BASE = 10000.0
_GGUF_27B_LAYERS = 62


class Gemma3(TransformerLM):
  """Gemma 3's text model: `TransformerLM`'s fields (their docs are there), with Gemma 3's
  choices as defaults where they are not `TransformerLM`'s (rotate-half rotary positions, no
  biases)."""

  block: BlockKind = "sandwich"
  norm: layers.NormKind = "rmsnorm_plus_one"
  norm_eps: PositiveFloat = 1e-6
  mlp_activation: layers.Activation = "geglu"
  rotary_base: PositiveFloat = 1000000.0
  layer_kinds: tuple[LayerKind, ...] = PATTERN
  window: PositiveInt | None = 1024
  sliding_rotary_base: PositiveFloat | None = 10000.0
  sliding_rotary_scaling: RotaryScaling | None = "none"
  qk_norm: layers.QkNorm = "head"
  query_pre_attention_scalar: PositiveFloat | None = 256.0
  embedding_scale: EmbeddingScale = "sqrt_dim"
  tie_embeddings: bool = True

  family_name = "gemma3"
  same_model_as = ()


def _whole(value: float) -> int | float:
  return int(value) if float(value).is_integer() else value


def _gguf_query_scalar(layers_count: int, dim: int, heads: int, head_dim: int) -> float:
  """The query scale llama.cpp's gemma3 derives: 1/sqrt(head width), except at 27B's layer
  count, where the width over the heads."""
  return float(dim // heads if layers_count == _GGUF_27B_LAYERS else head_dim)


# `query_pre_attn_scalar`: written as an int where it is one (transformers' Gemma3TextConfig
# takes no float there); a GGUF file's is the one llama.cpp derives from the sizes.
_QUERY_SCALAR = Rule(
    "query_pre_attn_scalar",
    lambda config, found: {
        "query_pre_attention_scalar": config.number("query_pre_attn_scalar", 256)},
    lambda model: {"query_pre_attn_scalar": _whole(model.query_pre_attention_scalar)},
    lambda metadata, arch, tensors, config: {"query_pre_attn_scalar": _gguf_query_scalar(
        config.get("num_hidden_layers", 26), config.get("hidden_size", 2304),
        config.get("num_attention_heads", 8), config.get("head_dim", 256))})


def _rope_from_metadata(metadata: Mapping[str, Any], arch: str, tensors: Any, config: dict
                        ) -> dict[str, Any]:
  """The global layers' base (`rope.freq_base`) and linear scaling; the sliding layers' base
  is llama.cpp's fixed one."""
  del tensors, config
  full = {"rope_type": "default", "rope_theta": metadata.get(f"{arch}.rope.freq_base", 1e6)}
  if metadata.get(f"{arch}.rope.scaling.type") == "linear":
    full.update(rope_type="linear", factor=metadata.get(f"{arch}.rope.scaling.factor", 1.0))
  return {"rope_parameters": {"full_attention": full, "sliding_attention": {
      "rope_type": "default", "rope_theta": _GGUF_SLIDING_BASE}}}


def _rope_metadata(model: Any) -> dict[str, Any]:
  found = {"rope.freq_base": float(model.rotary_base)}
  if model.rotary_scaling == "linear":
    found.update({"rope.scaling.type": "linear",
                  "rope.scaling.factor": float(model.rotary_scaling_factor)})
  return found


@format_names.names_for(Gemma3)
class Gemma3HfNames(TransformerHfNames):
  """Gemma 3's Hugging Face names (the text model's; a multimodal checkpoint's under
  `language_model.`): keys a config leaves out take transformers' defaults of
  `Gemma3TextConfig` (a multimodal checkpoint's `text_config` lists few)."""

  model_type = "gemma3_text"
  architecture = "Gemma3ForCausalLM"
  other_model_types = ("gemma3",)
  # Where a multimodal checkpoint (Gemma3ForConditionalGeneration) keeps the text model.
  wrapper_prefix = "language_model."
  config_rows = dense_names.CONFIG.changed(
      Fixed("hidden_activation", "gelu_pytorch_tanh"),
      Fixed("final_logit_softcapping", None), Fixed("attn_logit_softcapping", None),
      Fixed("use_bidirectional_attention", False), _QUERY_SCALAR,
      sliding_pattern(6, 4096, ("sliding_window_pattern", "_sliding_window_pattern"),
                      "attention.sliding_window"),
      per_kind_rope(1000000.0, "rope_local_base_freq", 10000.0, _rope_from_metadata,
                    _rope_metadata),
      drop=("hidden_act", "mlp_bias", "rope.dimension_count", "rope_theta", "rope_scaling"),
      vocab_size=262208, num_layers=26, dim=2304, num_heads=8, num_kv_heads=4, head_dim=256,
      mlp_dim=9216, max_length=131072, tie_embeddings=True)
  tensor_rows = dense_names.tensors(
      norm("attention_norm", "input_layernorm", "attn_norm"), ATTENTION, QK_NORMS,
      norm("attention_post_norm", "post_attention_layernorm", "post_attention_norm"),
      norm("mlp_norm", "pre_feedforward_layernorm", "ffn_norm"),
      norm("mlp_post_norm", "post_feedforward_layernorm", "post_ffw_norm"), swiglu(bias=False))

  @classmethod
  def file_names(cls, name: str) -> list[str]:
    return [name, cls.wrapper_prefix + name]

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    """The text model's fields (a multimodal checkpoint's from its `text_config`)."""
    if config.get("model_type") in cls.other_model_types:
      text = config.mapping("text_config")
      tied = config.get("tie_word_embeddings")
      config = HfConfig({**({} if tied is None else {"tie_word_embeddings": tied}), **text},
                        f"{config.where} text_config")
    return super().fields(config)


@format_names.names_for(Gemma3)
class Gemma3GgufNames(TransformerGgufNames):
  """llama.cpp's `gemma3`: the text model, every norm stored as 1 + weight, no rows
  rearranged (GGML's rope there is rotate-half)."""

  architecture = "gemma3"
  norm_offset = 1.0
  slides = True

  def check_writable(self) -> None:
    """Refuses what llama.cpp's gemma3 fixes otherwise: the 5:1 pattern, the sliding layers'
    base and scaling, the query scale, a full layers' scaling other than linear."""
    model = self.model
    problem = None
    if model.kinds_by_layer() != per_layer(PATTERN, model.num_layers):
      problem = "a pattern of attention kinds other than five sliding layers to one global"
    elif model.kind_fields("sliding")["rotary_base"] != _GGUF_SLIDING_BASE:
      problem = (f"sliding layers' rotary base {model.kind_fields('sliding')['rotary_base']} "
                 f"(llama.cpp's gemma3: {_GGUF_SLIDING_BASE})")
    elif model.rotary_scaling_settings("sliding"):
      problem = "rotary scaling on the sliding layers"
    elif model.rotary_scaling not in ("none", "linear"):
      problem = f"rope scaling {model.rotary_scaling!r}"
    elif model.query_pre_attention_scalar != _gguf_query_scalar(
        model.num_layers, model.dim, model.num_heads, model.resolved_head_dim):
      problem = (f"query_pre_attention_scalar={model.query_pre_attention_scalar} (llama.cpp "
                 "derives it from the head width)")
    if problem:
      raise UsageError(f"model: {problem}: a GGUF {self.architecture} model cannot express "
                       "it; export --export_format=hf")
    super().check_writable()
