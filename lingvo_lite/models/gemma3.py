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
from lingvo_lite.models import format_names, layers
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.checkpoint_names import (GgufTensor, HfConfig, TensorName,
                                                 dense, gguf_config, linear_attention, norm)
from lingvo_lite.models.transformer import (EmbeddingScale, PositionKind, RotaryScaling,
                                            TransformerLM)
from lingvo_lite.models.transformer_layers import LayerKind, per_layer
from lingvo_lite.models.transformer_names import (TransformerGgufNames, TransformerHfNames,
                                                  layer_kinds, layer_types,
                                                  per_kind_rope_parameters,
                                                  per_kind_rotary_fields)

# Five sliding layers, then a global one: Hugging Face's `sliding_window_pattern` of 6.
PATTERN: tuple[LayerKind, ...] = ("sliding",) * 5 + ("full",)
# What llama.cpp's gemma3 fixes (its loader has no key for them).
_GGUF_SLIDING_BASE = 10000.0
_GGUF_27B_LAYERS = 62


class Gemma3(TransformerLM):
  """Gemma 3's text model: `TransformerLM`'s fields (their docs are there), with Gemma 3's
  choices as defaults."""

  block: BlockKind = "sandwich"
  norm: layers.NormKind = "rmsnorm_plus_one"
  norm_eps: PositiveFloat = 1e-6
  mlp_activation: layers.Activation = "geglu"
  position: PositionKind = "rotary"
  rotary_style: layers.RotaryStyle = "half"
  rotary_base: PositiveFloat = 1000000.0
  layer_kinds: tuple[LayerKind, ...] = PATTERN
  window: PositiveInt | None = 1024
  sliding_rotary_base: PositiveFloat | None = 10000.0
  sliding_rotary_scaling: RotaryScaling | None = "none"
  qk_norm: layers.QkNorm = "head"
  query_pre_attention_scalar: PositiveFloat | None = 256.0
  embedding_scale: EmbeddingScale = "sqrt_dim"
  attention_bias: bool = False
  mlp_bias: bool = False
  tie_embeddings: bool = True

  family_name = "gemma3"
  same_model_as = ()


def _layer_tensors(index: int, attention_bias: bool) -> list[TensorName]:
  hf, ours = f"model.layers.{index}.", f"layer_{index}/"
  names = norm(f"{hf}input_layernorm", f"{ours}attention_norm", False)
  names += linear_attention(f"{hf}self_attn.", f"{ours}attention/",
                            ("q_proj", "k_proj", "v_proj", "o_proj"), attention_bias)
  names += norm(f"{hf}self_attn.q_norm", f"{ours}attention/query_norm", False)
  names += norm(f"{hf}self_attn.k_norm", f"{ours}attention/key_norm", False)
  names += norm(f"{hf}post_attention_layernorm", f"{ours}attention_post_norm", False)
  names += norm(f"{hf}pre_feedforward_layernorm", f"{ours}mlp_norm", False)
  names += norm(f"{hf}post_feedforward_layernorm", f"{ours}mlp_post_norm", False)
  names += dense(f"{hf}mlp.gate_proj", f"{ours}mlp/wi", False)
  names += dense(f"{hf}mlp.up_proj", f"{ours}mlp/wi_gate", False)
  names += dense(f"{hf}mlp.down_proj", f"{ours}mlp/wo", False)
  return names


@format_names.names_for(Gemma3)
class Gemma3HfNames(TransformerHfNames):
  """Gemma 3's Hugging Face names (the text model's; a multimodal checkpoint's under
  `language_model.`)."""

  model_type = "gemma3_text"
  architecture = "Gemma3ForCausalLM"
  other_model_types = ("gemma3",)
  # Where a multimodal checkpoint (Gemma3ForConditionalGeneration) keeps the text model.
  wrapper_prefix = "language_model."

  @classmethod
  def file_names(cls, name: str) -> list[str]:
    return [name, cls.wrapper_prefix + name]

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    """The text model's fields; keys a config leaves out take transformers' defaults of
    `Gemma3TextConfig` (a multimodal checkpoint's `text_config` lists few)."""
    if config.get("model_type") in cls.other_model_types:
      text = config.mapping("text_config")
      tied = config.get("tie_word_embeddings")
      config = HfConfig({**({} if tied is None else {"tie_word_embeddings": tied}), **text},
                        f"{config.where} text_config")
    config.expect("hidden_activation", ("gelu_pytorch_tanh",), "gelu_pytorch_tanh")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
      config.expect(key, (None,), None)
    config.expect("use_bidirectional_attention", (False,), False)
    num_layers = config.get("num_hidden_layers", 26)
    period = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", 6))
    kinds = layer_kinds(config, ["sliding_attention" if (index + 1) % period
                                 else "full_attention" for index in range(num_layers)],
                        num_layers)
    max_length = config.get("max_position_embeddings", 131072)
    return {
        "vocab_size": config.get("vocab_size", 262208), "num_layers": num_layers,
        "dim": config.get("hidden_size", 2304),
        "num_heads": config.get("num_attention_heads", 8),
        "num_kv_heads": config.get("num_key_value_heads", 4),
        "head_dim": config.get("head_dim", 256),
        "mlp_dim": config.get("intermediate_size", 9216),
        "norm_eps": config.number("rms_norm_eps", 1e-6),
        "max_length": max_length,
        "tie_embeddings": config.flag("tie_word_embeddings", True),
        "attention_bias": config.flag("attention_bias", False),
        "query_pre_attention_scalar": config.number("query_pre_attn_scalar", 256),
        "layer_kinds": kinds,
        "window": config.get("sliding_window", 4096) if "sliding" in kinds else None,
        **per_kind_rotary_fields(config, 1000000.0, "rope_local_base_freq", 10000.0,
                                 max_length=max_length),
    }

  def config(self) -> dict[str, Any]:
    model = self.model
    return {
        "model_type": self.model_type, "architectures": [self.architecture],
        "vocab_size": model.vocab_size, "num_hidden_layers": model.num_layers,
        "hidden_size": model.dim, "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.resolved_num_kv_heads, "head_dim": model.resolved_head_dim,
        "intermediate_size": model.resolved_mlp_dim, "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": model.norm_eps, "max_position_embeddings": model.max_length,
        "tie_word_embeddings": model.tie_embeddings, "attention_bias": model.attention_bias,
        # An int where it is one: transformers' Gemma3TextConfig takes no float there.
        "query_pre_attn_scalar": _whole(model.query_pre_attention_scalar),
        "sliding_window": model.window, "layer_types": layer_types(model),
        "final_logit_softcapping": None, "attn_logit_softcapping": None,
        "use_bidirectional_attention": False, **per_kind_rope_parameters(model),
    }

  def tensors(self) -> list[TensorName]:
    model = self.model
    names = [TensorName("model.embed_tokens.weight", ("embedding",), transposed=False)]
    for index in range(model.num_layers):
      names += _layer_tensors(index, model.attention_bias)
    names += norm("model.norm", "final_norm", False)
    if not model.tie_embeddings:
      names += dense("lm_head", "output", False)
    return names


def _whole(value: float) -> int | float:
  return int(value) if float(value).is_integer() else value


def _gguf_query_scalar(layers_count: int, dim: int, heads: int, head_dim: int) -> float:
  """The query scale llama.cpp's gemma3 derives: 1/sqrt(head width), except at 27B's layer
  count, where the width over the heads."""
  return float(dim // heads if layers_count == _GGUF_27B_LAYERS else head_dim)


@format_names.names_for(Gemma3)
class Gemma3GgufNames(TransformerGgufNames):
  """llama.cpp's `gemma3`: the text model, every norm stored as 1 + weight, no rows
  rearranged (GGML's rope there is rotate-half)."""

  architecture = "gemma3"

  @classmethod
  def hf_config(cls, metadata: Mapping[str, Any],
                tensors: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    arch = metadata["general.architecture"]
    config = {
        "model_type": cls.hf_model_type(),
        "vocab_size": tensors.get("token_embd.weight", (None,))[0],
        **gguf_config(metadata, {
            "vocab_size": "vocab_size", "num_hidden_layers": "block_count",
            "hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
            "num_attention_heads": "attention.head_count",
            "num_key_value_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
            "rms_norm_eps": "attention.layer_norm_rms_epsilon",
            "max_position_embeddings": "context_length", "sliding_window":
            "attention.sliding_window"}),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    full = {"rope_type": "default",
            "rope_theta": metadata.get(f"{arch}.rope.freq_base", 1000000.0)}
    if metadata.get(f"{arch}.rope.scaling.type") == "linear":
      full.update(rope_type="linear", factor=metadata.get(f"{arch}.rope.scaling.factor", 1.0))
    config["rope_parameters"] = {"full_attention": full, "sliding_attention": {
        "rope_type": "default", "rope_theta": _GGUF_SLIDING_BASE}}
    layers_count = config.get("num_hidden_layers", 26)
    heads = config.get("num_attention_heads", 8)
    config["query_pre_attn_scalar"] = _gguf_query_scalar(
        layers_count, config.get("hidden_size", 2304), heads,
        config.get("head_dim", 256))
    return {name: value for name, value in config.items() if value is not None}

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

  def metadata(self) -> dict[str, Any]:
    model = self.model
    found = {**super().metadata(),
             "attention.head_count_kv": model.resolved_num_kv_heads,
             "attention.key_length": model.resolved_head_dim,
             "attention.value_length": model.resolved_head_dim,
             "attention.layer_norm_rms_epsilon": float(model.norm_eps),
             "attention.sliding_window": int(model.window),
             "rope.freq_base": float(model.rotary_base)}
    if model.rotary_scaling == "linear":
      found.update({"rope.scaling.type": "linear",
                    "rope.scaling.factor": float(model.rotary_scaling_factor)})
    return found

  def tensors(self) -> dict[str, GgufTensor]:
    model = self.model
    if model.attention_bias:
      raise UsageError("model: a GGUF gemma3 with attention biases is not read yet; use its "
                       "Hugging Face folder (hf:PATH)")
    names = {"token_embd.weight": GgufTensor("model.embed_tokens.weight"),
             "output_norm.weight": GgufTensor("model.norm.weight", offset=1.0)}
    if not model.tie_embeddings:
      names["output.weight"] = GgufTensor("lm_head.weight")
    for index in range(model.num_layers):
      gguf, hf = f"blk.{index}.", f"model.layers.{index}."
      names.update({
          f"{gguf}attn_norm.weight": GgufTensor(f"{hf}input_layernorm.weight", offset=1.0),
          f"{gguf}attn_q.weight": GgufTensor(f"{hf}self_attn.q_proj.weight"),
          f"{gguf}attn_k.weight": GgufTensor(f"{hf}self_attn.k_proj.weight"),
          f"{gguf}attn_v.weight": GgufTensor(f"{hf}self_attn.v_proj.weight"),
          f"{gguf}attn_output.weight": GgufTensor(f"{hf}self_attn.o_proj.weight"),
          f"{gguf}attn_q_norm.weight": GgufTensor(f"{hf}self_attn.q_norm.weight", offset=1.0),
          f"{gguf}attn_k_norm.weight": GgufTensor(f"{hf}self_attn.k_norm.weight", offset=1.0),
          f"{gguf}post_attention_norm.weight": GgufTensor(
              f"{hf}post_attention_layernorm.weight", offset=1.0),
          f"{gguf}ffn_norm.weight": GgufTensor(f"{hf}pre_feedforward_layernorm.weight",
                                               offset=1.0),
          f"{gguf}post_ffw_norm.weight": GgufTensor(f"{hf}post_feedforward_layernorm.weight",
                                                    offset=1.0),
          f"{gguf}ffn_gate.weight": GgufTensor(f"{hf}mlp.gate_proj.weight"),
          f"{gguf}ffn_up.weight": GgufTensor(f"{hf}mlp.up_proj.weight"),
          f"{gguf}ffn_down.weight": GgufTensor(f"{hf}mlp.down_proj.weight"),
      })
    return names
