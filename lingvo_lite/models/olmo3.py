"""OLMo 3: three sliding-window layers to one full, norms after attention and MLP only, and an
RMSNorm of the whole query and key projections.

Choices, each a field of the shared transformer (models/transformer.py):

- layers: a pattern of three "sliding" layers (a window of 4096 positions) and one "full",
  repeated; both kinds rotate with base 500,000, and the full layers may scale their
  frequencies (YaRN, as the long-context releases do) where the sliding ones do not;
- "post_norm" blocks: x + norm(attention(x)), then x + norm(mlp(x)), no norm before either
  (OLMo 2's reordering);
- RMSNorm of queries and keys over the whole projection, before the rotary positions
  (`qk_norm="projection"`: a scale per head and feature), a SwiGLU MLP, grouped-query heads,
  no biases, an untied output.

Hugging Face: `Olmo3ForCausalLM` (model_type "olmo3"), whose head width is always the width
over the heads. GGUF: llama.cpp's converter writes OLMo 3 as its `olmo2` architecture (OLMo
2's blocks, which OLMo 3 kept), with `attention.sliding_window` and a per-layer
`attention.sliding_window_pattern` of booleans, and YaRN's `rope.scaling.*` keys for the full
layers; llama.cpp's olmo2 computes the head width as the width over the heads and never scales
the sliding layers. The `gguf` package reads and writes those keys; transformers has no olmo2
GGUF reader, so our reader is the other end of a round trip. An olmo2 file without a window
(OLMo 2) reads as this family with every layer full.
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.errors import UsageError
from lingvo_lite.fields import PositiveFloat, PositiveInt
from lingvo_lite.models import format_names, layers
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.checkpoint_names import (GgufTensor, HfConfig, TensorName,
                                                 dense, gguf_config, linear_attention, norm,
                                                 vector)
from lingvo_lite.models.transformer import PositionKind, RotaryScaling, TransformerLM
from lingvo_lite.models.transformer_layers import LayerKind
from lingvo_lite.models.transformer_names import (TransformerGgufNames, TransformerHfNames,
                                                  layer_kinds, layer_types,
                                                  per_kind_rope_parameters,
                                                  per_kind_rotary_fields)

PATTERN: tuple[LayerKind, ...] = ("sliding",) * 3 + ("full",)


class Olmo3(TransformerLM):
  """OLMo 3: `TransformerLM`'s fields (their docs are there), with OLMo 3's choices as
  defaults."""

  block: BlockKind = "post_norm"
  norm: layers.NormKind = "rmsnorm"
  norm_eps: PositiveFloat = 1e-6
  mlp_activation: layers.Activation = "swiglu"
  position: PositionKind = "rotary"
  rotary_style: layers.RotaryStyle = "half"
  rotary_base: PositiveFloat = 500000.0
  layer_kinds: tuple[LayerKind, ...] = PATTERN
  window: PositiveInt | None = 4096
  sliding_rotary_scaling: RotaryScaling | None = "none"
  qk_norm: layers.QkNorm = "projection"
  attention_bias: bool = False
  mlp_bias: bool = False
  tie_embeddings: bool = False

  family_name = "olmo3"
  same_model_as = ()


@format_names.names_for(Olmo3)
class Olmo3HfNames(TransformerHfNames):
  """OLMo 3's Hugging Face names."""

  model_type = "olmo3"
  architecture = "Olmo3ForCausalLM"

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    """Keys a config leaves out take transformers' defaults of `Olmo3Config`."""
    config.expect("hidden_act", ("silu",), "silu")
    num_layers = config.require("num_hidden_layers")
    kinds = layer_kinds(config, ["sliding_attention" if (index + 1) % 4 else "full_attention"
                                 for index in range(num_layers)], num_layers)
    max_length = config.get("max_position_embeddings", 2048)
    return {
        "vocab_size": config.require("vocab_size"), "num_layers": num_layers,
        "dim": config.require("hidden_size"),
        "num_heads": config.require("num_attention_heads"),
        "num_kv_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("head_dim"),
        "mlp_dim": config.require("intermediate_size"),
        "norm_eps": config.number("rms_norm_eps", 1e-5),
        "max_length": max_length,
        "tie_embeddings": config.flag("tie_word_embeddings", False),
        "attention_bias": config.flag("attention_bias", False),
        "layer_kinds": kinds,
        "window": config.get("sliding_window", 4096) if "sliding" in kinds else None,
        **per_kind_rotary_fields(config, 500000.0, None, 500000.0, max_length=max_length),
    }

  def config(self) -> dict[str, Any]:
    """No `head_dim`: transformers' OLMo 3 always takes the width over the heads (a model
    whose heads are otherwise is refused by the read back)."""
    model = self.model
    return {
        "model_type": self.model_type, "architectures": [self.architecture],
        "vocab_size": model.vocab_size, "num_hidden_layers": model.num_layers,
        "hidden_size": model.dim, "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.resolved_num_kv_heads,
        "intermediate_size": model.resolved_mlp_dim, "hidden_act": "silu",
        "rms_norm_eps": model.norm_eps, "max_position_embeddings": model.max_length,
        "tie_word_embeddings": model.tie_embeddings, "attention_bias": model.attention_bias,
        "sliding_window": model.window, "layer_types": layer_types(model),
        **per_kind_rope_parameters(model),
    }

  def tensors(self) -> list[TensorName]:
    model = self.model
    names = [TensorName("model.embed_tokens.weight", ("embedding",), transposed=False)]
    for index in range(model.num_layers):
      hf, ours = f"model.layers.{index}.", f"layer_{index}/"
      names += linear_attention(f"{hf}self_attn.", f"{ours}attention/",
                                ("q_proj", "k_proj", "v_proj", "o_proj"), model.attention_bias)
      # [heads * head_dim] vectors, ours [heads, head_dim]: the projection's order.
      names += [vector(f"{hf}self_attn.q_norm.weight", f"{ours}attention/query_norm/scale"),
                vector(f"{hf}self_attn.k_norm.weight", f"{ours}attention/key_norm/scale")]
      names += norm(f"{hf}post_attention_layernorm", f"{ours}attention_post_norm", False)
      names += dense(f"{hf}mlp.gate_proj", f"{ours}mlp/wi", False)
      names += dense(f"{hf}mlp.up_proj", f"{ours}mlp/wi_gate", False)
      names += dense(f"{hf}mlp.down_proj", f"{ours}mlp/wo", False)
      names += norm(f"{hf}post_feedforward_layernorm", f"{ours}mlp_post_norm", False)
    names += norm("model.norm", "final_norm", False)
    if not model.tie_embeddings:
      names += dense("lm_head", "output", False)
    return names


@format_names.names_for(Olmo3)
class Olmo3GgufNames(TransformerGgufNames):
  """llama.cpp's `olmo2`, as its converter writes OLMo 3 (module doc)."""

  architecture = "olmo2"

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
            "num_key_value_heads": "attention.head_count_kv",
            "rms_norm_eps": "attention.layer_norm_rms_epsilon",
            "max_position_embeddings": "context_length"}),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    layers_count = config.get("num_hidden_layers", 0)
    window = metadata.get(f"{arch}.attention.sliding_window")
    pattern = metadata.get(f"{arch}.attention.sliding_window_pattern")
    if window:
      if isinstance(pattern, int):  # A period: every layer but each period's last slides.
        pattern = [(index + 1) % pattern != 0 for index in range(layers_count)]
      elif pattern is None:  # llama.cpp's default for OLMo 3.
        pattern = [(index + 1) % 4 != 0 for index in range(layers_count)]
      config["sliding_window"] = window
      config["layer_types"] = ["sliding_attention" if slides else "full_attention"
                               for slides in pattern]
    else:
      config["layer_types"] = ["full_attention"] * layers_count
    base = metadata.get(f"{arch}.rope.freq_base", 10000.0)
    full = {"rope_type": "default", "rope_theta": base}
    if metadata.get(f"{arch}.rope.scaling.type") == "yarn":
      full.update(rope_type="yarn", factor=metadata.get(f"{arch}.rope.scaling.factor"),
                  attention_factor=metadata.get(f"{arch}.rope.scaling.attn_factor"),
                  original_max_position_embeddings=metadata.get(
                      f"{arch}.rope.scaling.original_context_length"),
                  beta_fast=metadata.get(f"{arch}.rope.scaling.yarn_beta_fast", 32.0),
                  beta_slow=metadata.get(f"{arch}.rope.scaling.yarn_beta_slow", 1.0))
    config["rope_parameters"] = {"full_attention": full, "sliding_attention": {
        "rope_type": "default", "rope_theta": metadata.get(f"{arch}.rope.freq_base_swa",
                                                           base)}}
    return {name: value for name, value in config.items() if value is not None}

  def check_writable(self) -> None:
    """Refuses what llama.cpp's olmo2 computes otherwise: another head width than the width
    over the heads, scaled sliding layers, a full layers' scaling other than YaRN."""
    model = self.model
    problem = None
    if model.resolved_head_dim * model.num_heads != model.dim:
      problem = (f"head_dim={model.resolved_head_dim} (llama.cpp's olmo2 takes "
                 f"dim / num_heads = {model.dim // model.num_heads})")
    elif model.rotary_scaling_settings("sliding"):
      problem = "rotary scaling on the sliding layers"
    elif model.rotary_scaling not in ("none", "yarn"):
      problem = f"rope scaling {model.rotary_scaling!r}"
    elif model.rotary_scaling == "yarn" and not model.rotary_truncate:
      problem = "YaRN with an unrounded correction range (rotary_truncate=False)"
    elif "no_rotary" in model.kinds_by_layer():
      problem = "layers without rotary positions"
    if problem:
      raise UsageError(f"model: {problem}: a GGUF {self.architecture} model cannot express "
                       "it; export --export_format=hf")

  def metadata(self) -> dict[str, Any]:
    model = self.model
    found = {**super().metadata(),
             "attention.head_count_kv": model.resolved_num_kv_heads,
             "attention.layer_norm_rms_epsilon": float(model.norm_eps),
             "rope.freq_base": float(model.rotary_base)}
    kinds = model.kinds_by_layer()
    if "sliding" in kinds:
      found["attention.sliding_window"] = int(model.window)
      found["attention.sliding_window_pattern"] = [kind == "sliding" for kind in kinds]
      sliding_base = model.kind_fields("sliding")["rotary_base"]
      if sliding_base != model.rotary_base:
        found["rope.freq_base_swa"] = float(sliding_base)
    settings = model.rotary_scaling_settings("full")
    if settings:
      _, factor, original, beta_fast, beta_slow, attention, _ = settings
      found.update({"rope.scaling.type": "yarn", "rope.scaling.factor": float(factor),
                    "rope.scaling.attn_factor": float(attention),
                    "rope.scaling.original_context_length": int(original),
                    "rope.scaling.yarn_beta_fast": float(beta_fast),
                    "rope.scaling.yarn_beta_slow": float(beta_slow)})
    return found

  def tensors(self) -> dict[str, GgufTensor]:
    model = self.model
    if model.attention_bias:
      raise UsageError("model: a GGUF olmo2 with attention biases is not read yet; use its "
                       "Hugging Face folder (hf:PATH)")
    names = {"token_embd.weight": GgufTensor("model.embed_tokens.weight"),
             "output_norm.weight": GgufTensor("model.norm.weight")}
    if not model.tie_embeddings:
      names["output.weight"] = GgufTensor("lm_head.weight")
    for index in range(model.num_layers):
      gguf, hf = f"blk.{index}.", f"model.layers.{index}."
      names.update({
          f"{gguf}attn_q.weight": GgufTensor(f"{hf}self_attn.q_proj.weight"),
          f"{gguf}attn_k.weight": GgufTensor(f"{hf}self_attn.k_proj.weight"),
          f"{gguf}attn_v.weight": GgufTensor(f"{hf}self_attn.v_proj.weight"),
          f"{gguf}attn_output.weight": GgufTensor(f"{hf}self_attn.o_proj.weight"),
          f"{gguf}attn_q_norm.weight": GgufTensor(f"{hf}self_attn.q_norm.weight"),
          f"{gguf}attn_k_norm.weight": GgufTensor(f"{hf}self_attn.k_norm.weight"),
          f"{gguf}post_attention_norm.weight": GgufTensor(
              f"{hf}post_attention_layernorm.weight"),
          f"{gguf}ffn_gate.weight": GgufTensor(f"{hf}mlp.gate_proj.weight"),
          f"{gguf}ffn_up.weight": GgufTensor(f"{hf}mlp.up_proj.weight"),
          f"{gguf}ffn_down.weight": GgufTensor(f"{hf}mlp.down_proj.weight"),
          f"{gguf}post_ffw_norm.weight": GgufTensor(f"{hf}post_feedforward_layernorm.weight"),
      })
    return names
