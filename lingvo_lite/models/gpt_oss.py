"""gpt-oss: OpenAI's open-weight mixture of experts (gpt-oss-20b: 24 layers, 32 experts, 4 per
token; gpt-oss-120b: 36 layers, 128 experts).

Pre-RMSNorm blocks whose attention has biases on every projection, grouped-query heads of 64,
rotate-half rotary positions scaled by YaRN (factor 32 over an original 4096 positions, its
correction range not rounded: `rotary_truncate=False`), a learned "sink" logit per query head
that each query's softmax also sums over (weight that goes to no value:
`layers.Attention.sinks`, which every attention path takes: the written-out one, the TPU's
splash kernel, which takes sinks itself, and decoding; jax.nn.dot_product_attention takes
none, so "xla" and "cudnn" run the written-out path), and layers alternating a sliding window
of 128 and full attention (the first slides).

The feed-forward layer is models/moe.py's with gpt-oss's choices: a router with a bias, the
top 4 logits' softmax (the renormalized softmax of all, exactly), experts with biases on every
projection and the clamped SwiGLU: gate = min(x W_gate + b, 7), up = clip(x W_up + b, -7, 7),
out = (up + 1) * gate * sigmoid(1.702 gate).

Hugging Face (`GptOssForCausalLM`, model_type "gpt_oss") stores the experts stacked, [experts,
in, out]: `mlp.experts.gate_up_proj` with the gate and up columns interleaved (gate, up, gate,
...), its bias likewise, `down_proj` and its bias; the router as `mlp.router`, the sinks as
`self_attn.sinks`. The released checkpoints store the experts' two matrices as MXFP4 blocks and
scales (`gate_up_proj_blocks`, `_scales`), which the Hugging Face reader dequantizes
(weights/mxfp4.py); export writes them unquantized. llama.cpp's `gpt-oss` splits gate and up
(`ffn_gate_exps`, `ffn_up_exps`, [experts, out, in]) and fixes the pattern (the first layer
slides, every other after it) and YaRN's slopes (32, 1): a model it cannot hold is refused.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.errors import UsageError
from lingvo_lite.fields import PositiveFloat, PositiveInt
from lingvo_lite.models import format_names, layers, moe
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.checkpoint_names import (GgufTensor, HfConfig, TensorName,
                                                 dense, gguf_config, linear_attention, norm,
                                                 vector)
from lingvo_lite.models.moe_names import MoeHfNames, router_aux_loss
from lingvo_lite.models.moe_transformer import MoeTransformerLM
from lingvo_lite.models.transformer import PositionKind, RotaryScaling
from lingvo_lite.models.transformer_layers import LayerKind
from lingvo_lite.models.transformer_names import (TransformerGgufNames, layer_kinds,
                                                  layer_types, rope_scaling,
                                                  rotary_scaling_fields)

# llama.cpp's gpt-oss: the first layer slides, then every other one.
_GGUF_PATTERN = ("sliding", "full")


class SinkAttention(layers.Attention):
  """The shared attention with a learned sink logit per query head (`sinks`: logical axis
  `heads`, so the tensor axis splits it as it splits the heads)."""

  def sinks(self) -> jax.Array:
    init = nn.with_logical_partitioning(nn.initializers.zeros, ("heads",))
    return self.param("sinks", init, (self.num_heads,), self.param_dtype).astype(jnp.float32)


class GptOss(MoeTransformerLM):
  """gpt-oss: `MoeTransformerLM`'s fields (their docs are there and `TransformerLM`'s) with
  gpt-oss's choices as defaults (gpt-oss-20b's)."""

  block: BlockKind = "sequential"
  norm: layers.NormKind = "rmsnorm"
  norm_eps: PositiveFloat = 1e-5
  mlp_activation: layers.Activation = "swiglu"
  position: PositionKind = "rotary"
  rotary_style: layers.RotaryStyle = "half"
  rotary_base: PositiveFloat = 150000.0
  rotary_scaling: RotaryScaling = "yarn"
  rotary_scaling_factor: PositiveFloat = 32.0
  rotary_original_max_length: PositiveInt = 4096
  rotary_truncate: bool = False
  layer_kinds: tuple[LayerKind, ...] = _GGUF_PATTERN
  window: PositiveInt | None = 128
  attention_bias: bool = True
  num_experts: PositiveInt = 32
  experts_per_token: PositiveInt = 4
  router_bias: bool = True
  expert_bias: bool = True
  expert_activation: moe.ExpertActivation = "clamped_swiglu"

  family_name = "gpt_oss"
  same_model_as = ()

  @nn.nowrap
  def attention_module(self) -> tuple[type[layers.Attention], dict[str, Any]]:
    return SinkAttention, {}

  @nn.nowrap
  def num_parameters(self) -> int:
    return super().num_parameters() + self.num_layers * self.num_heads  # The sinks.


@format_names.names_for(GptOss)
class GptOssHfNames(MoeHfNames):
  """gpt-oss's Hugging Face names (unquantized; MXFP4 experts read dequantized)."""

  model_type = "gpt_oss"
  architecture = "GptOssForCausalLM"

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    layers_count = config.require("num_hidden_layers")
    default = ["sliding_attention" if (index + 1) % 2 else "full_attention"
               for index in range(layers_count)]
    kinds = layer_kinds(config, default, layers_count)
    max_length = config.get("max_position_embeddings", 131072)
    return {
        "vocab_size": config.require("vocab_size"),
        "num_layers": layers_count,
        "dim": config.require("hidden_size"),
        "num_heads": config.require("num_attention_heads"),
        "num_kv_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("head_dim", 64),
        "mlp_dim": config.require("intermediate_size"),
        "num_experts": config.require("num_local_experts"),
        "experts_per_token": config.require("num_experts_per_tok"),
        "swiglu_alpha": config.number("swiglu_alpha", 1.702),
        "swiglu_limit": config.number("swiglu_limit", 7.0),
        "norm_eps": config.number("rms_norm_eps", 1e-5),
        "rotary_base": config.rope_theta(150000.0),
        "rotary_scaling": "none",
        "max_length": max_length,
        "tie_embeddings": config.flag("tie_word_embeddings", False),
        "attention_bias": config.flag("attention_bias", True),
        "layer_kinds": kinds,
        "window": config.get("sliding_window", 128) if "sliding" in kinds else None,
        **router_aux_loss(config),
        **rotary_scaling_fields(config, config.rope_scaling(), "rope_scaling",
                                max_length=max_length),
    }

  def config(self) -> dict[str, Any]:
    model = self.model
    sliding = "sliding" in model.kinds_by_layer()
    scaling = rope_scaling(model.rotary_scaling_settings("full")) or {"rope_type": "default"}
    return {
        "model_type": self.model_type, "architectures": [self.architecture],
        "vocab_size": model.vocab_size, "num_hidden_layers": model.num_layers,
        "hidden_size": model.dim, "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.resolved_num_kv_heads, "head_dim": model.resolved_head_dim,
        "intermediate_size": model.resolved_expert_mlp_dim, "hidden_act": "silu",
        "num_local_experts": model.num_experts, "num_experts_per_tok": model.experts_per_token,
        "swiglu_alpha": model.swiglu_alpha, "swiglu_limit": model.swiglu_limit,
        "router_aux_loss_coef": model.load_balance_coefficient, "output_router_logits": False,
        "rms_norm_eps": model.norm_eps, "max_position_embeddings": model.max_length,
        "attention_bias": model.attention_bias, "layer_types": layer_types(model),
        "sliding_window": model.window if sliding else None,
        "tie_word_embeddings": model.tie_embeddings,
        "rope_parameters": {**scaling, "rope_theta": model.rotary_base},
    }

  def tensors(self) -> list[TensorName]:
    model = self.model
    names = [TensorName("model.embed_tokens.weight", ("embedding",), transposed=False)]
    for index in range(model.num_layers):
      hf, ours = f"model.layers.{index}.", f"layer_{index}/"
      experts, mlp = f"{hf}mlp.experts.", f"{ours}mlp/"
      names += norm(f"{hf}input_layernorm", f"{ours}attention_norm", False)
      names += linear_attention(f"{hf}self_attn.", f"{ours}attention/",
                                ("q_proj", "k_proj", "v_proj", "o_proj"), model.attention_bias)
      names.append(vector(f"{hf}self_attn.sinks", f"{ours}attention/sinks"))
      names += norm(f"{hf}post_attention_layernorm", f"{ours}mlp_norm", False)
      names.append(TensorName(f"{hf}mlp.router.weight", (f"{mlp}router_kernel",)))
      names.append(vector(f"{hf}mlp.router.bias", f"{mlp}router_bias"))
      # Stacked [experts, in, out]; the gate and up columns alternate.
      names += [
          TensorName(f"{experts}gate_up_proj", (f"{mlp}wi", f"{mlp}wi_gate"), 1, False,
                     interleaved=True, stacked=1),
          TensorName(f"{experts}gate_up_proj_bias", (f"{mlp}wi_bias", f"{mlp}wi_gate_bias"), 0,
                     False, interleaved=True, stacked=1),
          TensorName(f"{experts}down_proj", (f"{mlp}wo",), 1, False, stacked=1),
          TensorName(f"{experts}down_proj_bias", (f"{mlp}wo_bias",), 0, False, stacked=1)]
    names += norm("model.norm", "final_norm", False)
    if not model.tie_embeddings:
      names += dense("lm_head", "output", False)
    return names


@format_names.names_for(GptOss)
class GptOssGgufNames(TransformerGgufNames):
  """llama.cpp's `gpt-oss`."""

  architecture = "gpt-oss"

  @classmethod
  def hf_config(cls, metadata: Mapping[str, Any],
                tensors: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    arch = metadata["general.architecture"]
    config = {
        "model_type": cls.hf_model_type(),
        "vocab_size": tensors.get("token_embd.weight", (None,))[0],  # Unless the file says.
        **gguf_config(metadata, {
            "vocab_size": "vocab_size", "num_hidden_layers": "block_count",
            "hidden_size": "embedding_length",
            "intermediate_size": "expert_feed_forward_length",
            "num_attention_heads": "attention.head_count",
            "num_key_value_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
            "rms_norm_eps": "attention.layer_norm_rms_epsilon",
            "max_position_embeddings": "context_length", "num_local_experts": "expert_count",
            "num_experts_per_tok": "expert_used_count",
            "sliding_window": "attention.sliding_window"}),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    layers_count = config.get("num_hidden_layers")
    if isinstance(layers_count, int):
      config["layer_types"] = ["sliding_attention" if index % 2 == 0 else "full_attention"
                               for index in range(layers_count)]
    parameters = {"rope_theta": metadata.get(f"{arch}.rope.freq_base", 150000.0)}
    if metadata.get(f"{arch}.rope.scaling.type") == "yarn":
      parameters.update(rope_type="yarn", beta_fast=32.0, beta_slow=1.0, truncate=False,
                        factor=metadata.get(f"{arch}.rope.scaling.factor", 32.0),
                        original_max_position_embeddings=metadata.get(
                            f"{arch}.rope.scaling.original_context_length", 4096))
    config["rope_parameters"] = parameters
    return {name: value for name, value in config.items() if value is not None}

  def check_writable(self) -> None:
    model = self.model
    if model.kinds_by_layer() != tuple(_GGUF_PATTERN[i % 2] for i in range(model.num_layers)):
      raise UsageError(f"model.layer_kinds={model.layer_kinds!r}: llama.cpp's gpt-oss slides "
                       "the first layer's window and every other layer's after it; export "
                       "--export_format=hf")
    settings = model.rotary_scaling_settings("full")
    if settings[:1] != ("yarn",) or settings[3:5] != (32.0, 1.0) or settings[6]:
      raise UsageError(f"model.rotary_scaling={model.rotary_scaling!r}: llama.cpp's gpt-oss "
                       "stores YaRN with slopes 32 and 1 and an unrounded correction range "
                       "(its factor and original length alone); export --export_format=hf")
    if (model.swiglu_alpha, model.swiglu_limit) != (1.702, 7.0) or not model.attention_bias:
      raise UsageError("model: llama.cpp's gpt-oss fixes the clamped SwiGLU (alpha 1.702, "
                       "limit 7) and the attention's biases; export --export_format=hf")

  def metadata(self) -> dict[str, int | float | str]:
    model = self.model
    settings = model.rotary_scaling_settings("full")
    return {**super().metadata(), "feed_forward_length": model.resolved_expert_mlp_dim,
            "attention.head_count_kv": model.resolved_num_kv_heads,
            "attention.key_length": model.resolved_head_dim,
            "attention.value_length": model.resolved_head_dim,
            "attention.layer_norm_rms_epsilon": float(model.norm_eps),
            "rope.freq_base": float(model.rotary_base),
            "rope.dimension_count": model.resolved_head_dim,
            "rope.scaling.type": "yarn", "rope.scaling.factor": float(settings[1]),
            "rope.scaling.original_context_length": int(settings[2]),
            "attention.sliding_window": model.window, "expert_count": model.num_experts,
            "expert_used_count": model.experts_per_token,
            "expert_feed_forward_length": model.resolved_expert_mlp_dim}

  def tensors(self) -> dict[str, GgufTensor]:
    model = self.model
    names = {"token_embd.weight": GgufTensor("model.embed_tokens.weight"),
             "output_norm.weight": GgufTensor("model.norm.weight")}
    if not model.tie_embeddings:
      names["output.weight"] = GgufTensor("lm_head.weight")
    for index in range(model.num_layers):
      gguf, hf = f"blk.{index}.", f"model.layers.{index}."
      experts = f"{hf}mlp.experts."
      names.update({
          f"{gguf}attn_norm.weight": GgufTensor(f"{hf}input_layernorm.weight"),
          f"{gguf}post_attention_norm.weight": GgufTensor(
              f"{hf}post_attention_layernorm.weight"),
          f"{gguf}attn_sinks.weight": GgufTensor(f"{hf}self_attn.sinks"),
          f"{gguf}ffn_gate_inp.weight": GgufTensor(f"{hf}mlp.router.weight"),
          f"{gguf}ffn_gate_inp.bias": GgufTensor(f"{hf}mlp.router.bias"),
          # [experts, in, out] to [experts, out, in]; gate and up columns apart.
          f"{gguf}ffn_gate_exps.weight": GgufTensor(f"{experts}gate_up_proj", transposed=True,
                                                    columns=(0, 2)),
          f"{gguf}ffn_up_exps.weight": GgufTensor(f"{experts}gate_up_proj", transposed=True,
                                                  columns=(1, 2)),
          f"{gguf}ffn_down_exps.weight": GgufTensor(f"{experts}down_proj", transposed=True),
          f"{gguf}ffn_gate_exps.bias": GgufTensor(f"{experts}gate_up_proj_bias",
                                                  columns=(0, 2)),
          f"{gguf}ffn_up_exps.bias": GgufTensor(f"{experts}gate_up_proj_bias", columns=(1, 2)),
          f"{gguf}ffn_down_exps.bias": GgufTensor(f"{experts}down_proj_bias"),
      })
      for projection, kind in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"),
                               ("o_proj", "output")):
        for part in ("weight", "bias"):
          names[f"{gguf}attn_{kind}.{part}"] = GgufTensor(f"{hf}self_attn.{projection}.{part}")
    return names
