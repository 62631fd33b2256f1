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
from lingvo_lite.models import dense_names, format_names, layers, moe, moe_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import NUMBER, ROPE_THETA, Fixed, Key, Rule
from lingvo_lite.models.dense_names import BLOCK, LAYER, norm
from lingvo_lite.models.moe_transformer import MoeTransformerLM
from lingvo_lite.models.rope_names import rope_scaling, rotary_scaling_fields
from lingvo_lite.models.tensor_rows import Tensor, vector
from lingvo_lite.models.transformer import RotaryScaling
from lingvo_lite.models.transformer_layers import LayerKind
from lingvo_lite.models.transformer_names import TransformerGgufNames, sliding_pattern

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
  gpt-oss's choices as defaults (gpt-oss-20b's) where they are not `TransformerLM`'s."""

  norm: layers.NormKind = "rmsnorm"
  mlp_activation: layers.Activation = "swiglu"
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


def _rope_fields(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  return {"rotary_scaling": "none", **rotary_scaling_fields(
      config, config.rope_scaling(), "rope_scaling", max_length=found["max_length"])}


def _rope_config(model: Any) -> dict[str, Any]:
  scaling = rope_scaling(model.rotary_scaling_settings("full")) or {"rope_type": "default"}
  return {"rope_parameters": {**scaling, "rope_theta": model.rotary_base}}


def _rope_from_metadata(metadata: Mapping[str, Any], arch: str, tensors: Any, config: dict
                        ) -> dict[str, Any]:
  """YaRN as llama.cpp's gpt-oss fixes it: its factor and original length alone."""
  del tensors, config
  if metadata.get(f"{arch}.rope.scaling.type") != "yarn":
    return {}
  return {"rope_parameters": {
      "rope_type": "yarn", "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
      "factor": metadata.get(f"{arch}.rope.scaling.factor", 32.0),
      "original_max_position_embeddings": metadata.get(
          f"{arch}.rope.scaling.original_context_length", 4096)}}


def _rope_metadata(model: Any) -> dict[str, Any]:
  settings = model.rotary_scaling_settings("full")
  if not settings:
    return {}
  return {"rope.scaling.type": "yarn", "rope.scaling.factor": float(settings[1]),
          "rope.scaling.original_context_length": int(settings[2])}


@format_names.names_for(GptOss)
class GptOssHfNames(moe_names.MoeHfNames):
  """gpt-oss's Hugging Face names (unquantized; MXFP4 experts read dequantized):
  `intermediate_size` is the experts' width, the rotary base and YaRN one `rope_parameters`;
  the experts stacked [experts, in, out], the gate and up columns alternating in
  `gate_up_proj`, which llama.cpp splits in two."""

  model_type = "gpt_oss"
  architecture = "GptOssForCausalLM"
  config_rows = moe_names.CONFIG.changed(
      Fixed("hidden_act", "silu", checked=False),
      Key("mlp_dim", "intermediate_size", "expert_feed_forward_length",
          source="resolved_expert_mlp_dim"),
      Key("mlp_dim", None, "feed_forward_length", source="resolved_expert_mlp_dim"),
      Key("rotary_base", "rope_theta", "rope.freq_base", 150000.0, ROPE_THETA, written=False),
      Rule("rope_scaling", _rope_fields, _rope_config, _rope_from_metadata, _rope_metadata),
      Key("swiglu_alpha", "swiglu_alpha", None, 1.702, NUMBER),
      Key("swiglu_limit", "swiglu_limit", None, 7.0, NUMBER),
      sliding_pattern(2, 128, gguf_window="attention.sliding_window"),
      drop=("mlp_bias",),
      head_dim=64, norm_eps=1e-5, max_length=131072, attention_bias=True)
  tensor_rows = dense_names.tensors(
      norm("attention_norm", "input_layernorm", "attn_norm"),
      dense_names.attention(gguf_bias=True),
      (vector("layer_{i}/attention/sinks", f"{LAYER}self_attn.sinks",
              f"{BLOCK}attn_sinks.weight"),),
      norm("mlp_norm", "post_attention_layernorm", "post_attention_norm"),
      (Tensor("layer_{i}/mlp/router_kernel", f"{LAYER}mlp.router.weight",
              f"{BLOCK}ffn_gate_inp.weight"),
       vector("layer_{i}/mlp/router_bias", f"{LAYER}mlp.router.bias",
              f"{BLOCK}ffn_gate_inp.bias"),
       Tensor(("layer_{i}/mlp/wi", "layer_{i}/mlp/wi_gate"), f"{LAYER}mlp.experts.gate_up_proj",
              (f"{BLOCK}ffn_gate_exps.weight", f"{BLOCK}ffn_up_exps.weight"), transposed=False,
              interleaved=True, stacked=1),
       vector(("layer_{i}/mlp/wi_bias", "layer_{i}/mlp/wi_gate_bias"),
              f"{LAYER}mlp.experts.gate_up_proj_bias",
              (f"{BLOCK}ffn_gate_exps.bias", f"{BLOCK}ffn_up_exps.bias"), interleaved=True,
              stacked=1),
       Tensor("layer_{i}/mlp/wo", f"{LAYER}mlp.experts.down_proj", f"{BLOCK}ffn_down_exps.weight",
              transposed=False, stacked=1),
       vector("layer_{i}/mlp/wo_bias", f"{LAYER}mlp.experts.down_proj_bias",
              f"{BLOCK}ffn_down_exps.bias", stacked=1)))


@format_names.names_for(GptOss)
class GptOssGgufNames(TransformerGgufNames):
  """llama.cpp's `gpt-oss`."""

  architecture = "gpt-oss"
  slides = True

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
    super().check_writable()
