"""Mixtral: Mistral's attention with a mixture of 8 SwiGLU experts, 2 per token, in every layer.

Llama's blocks (pre-RMSNorm, rotate-half rotary positions, grouped-query attention, no
biases) whose MLP is models/moe.py's layer: a softmax router over 8 experts, the top 2
renormalized to sum to 1 (Mixtral always renormalizes), no shared expert. Mixtral-8x7B
attends to its whole context (`sliding_window` null in its config); a config with a window
reads as every layer "sliding" (Mistral's band and ring cache).

Hugging Face (`MixtralForCausalLM`, model_type "mixtral") stores the router as
`block_sparse_moe.gate` and each expert's w1 (gate: our `wi`), w3 (up: `wi_gate`) and w2 (down:
`wo`) as tensors of their own; llama.cpp converts Mixtral to its `llama` architecture with
`expert_count` and the experts stacked (`ffn_{gate,up,down}_exps`, the router `ffn_gate_inp`).
transformers does not read a Mixtral GGUF file; ours does.
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import format_names, layers
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.checkpoint_names import (GgufTensor, HfConfig, TensorName,
                                                 dense, linear_attention, norm)
from lingvo_lite.models.llama import LlamaGgufNames
from lingvo_lite.models.moe_names import MoeHfNames, per_expert, router_aux_loss
from lingvo_lite.models.moe_transformer import MoeTransformerLM
from lingvo_lite.models.transformer import PositionKind
from lingvo_lite.models.transformer_names import rope_scaling, rotary_scaling_fields

# Our stacked parameter of each Hugging Face expert projection.
_PROJECTIONS = (("w1", "wi"), ("w3", "wi_gate"), ("w2", "wo"))


class Mixtral(MoeTransformerLM):
  """Mixtral: `MoeTransformerLM`'s fields (their docs are there and `TransformerLM`'s) with
  Mixtral's choices as defaults."""

  block: BlockKind = "sequential"
  norm: layers.NormKind = "rmsnorm"
  norm_eps: PositiveFloat = 1e-5
  mlp_activation: layers.Activation = "swiglu"
  position: PositionKind = "rotary"
  rotary_style: layers.RotaryStyle = "half"
  rotary_base: PositiveFloat = 1000000.0

  family_name = "mixtral"
  same_model_as = ()


@format_names.names_for(Mixtral)
class MixtralHfNames(MoeHfNames):
  """Mixtral's Hugging Face names."""

  model_type = "mixtral"
  architecture = "MixtralForCausalLM"

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    config.expect("hidden_act", ("silu",), "silu")
    window = config.get("sliding_window")
    max_length = config.get("max_position_embeddings", 4096 * 32)
    return {
        "vocab_size": config.require("vocab_size"),
        "num_layers": config.require("num_hidden_layers"),
        "dim": config.require("hidden_size"),
        "num_heads": config.require("num_attention_heads"),
        "num_kv_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("head_dim"),
        "mlp_dim": config.require("intermediate_size"),
        "num_experts": config.require("num_local_experts"),
        "experts_per_token": config.require("num_experts_per_tok"),
        "norm_eps": config.number("rms_norm_eps", 1e-5),
        "rotary_base": config.rope_theta(1000000.0),
        "max_length": max_length,
        "tie_embeddings": config.flag("tie_word_embeddings", False),
        "layer_kinds": ("sliding",) if window is not None else ("full",),
        "window": window,
        **router_aux_loss(config),
        **rotary_scaling_fields(config, config.rope_scaling(), "rope_scaling",
                                max_length=max_length),
    }

  def config(self) -> dict[str, Any]:
    model = self.model
    sliding = "sliding" in model.kinds_by_layer()
    return {
        "model_type": self.model_type, "architectures": [self.architecture],
        "vocab_size": model.vocab_size, "num_hidden_layers": model.num_layers,
        "hidden_size": model.dim, "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.resolved_num_kv_heads, "head_dim": model.resolved_head_dim,
        "intermediate_size": model.resolved_expert_mlp_dim, "hidden_act": "silu",
        "num_local_experts": model.num_experts, "num_experts_per_tok": model.experts_per_token,
        "router_aux_loss_coef": model.load_balance_coefficient, "router_jitter_noise": 0.0,
        "output_router_logits": False, "rms_norm_eps": model.norm_eps,
        "rope_theta": model.rotary_base, "max_position_embeddings": model.max_length,
        "sliding_window": model.window if sliding else None,
        "tie_word_embeddings": model.tie_embeddings,
        **({} if model.rotary_scaling == "none" else {
            "rope_scaling": rope_scaling(model.rotary_scaling_settings("full"))}),
    }

  def tensors(self) -> list[TensorName]:
    model = self.model
    names = [TensorName("model.embed_tokens.weight", ("embedding",), transposed=False)]
    for index in range(model.num_layers):
      hf, ours = f"model.layers.{index}.", f"layer_{index}/"
      names += norm(f"{hf}input_layernorm", f"{ours}attention_norm", False)
      names += linear_attention(f"{hf}self_attn.", f"{ours}attention/",
                                ("q_proj", "k_proj", "v_proj", "o_proj"), False)
      names += norm(f"{hf}post_attention_layernorm", f"{ours}mlp_norm", False)
      names.append(TensorName(f"{hf}block_sparse_moe.gate.weight", (f"{ours}mlp/router_kernel",)))
      names += per_expert(f"{hf}block_sparse_moe.experts.", f"{ours}mlp/", model.num_experts,
                          _PROJECTIONS)
    names += norm("model.norm", "final_norm", False)
    if not model.tie_embeddings:
      names += dense("lm_head", "output", False)
    return names


@format_names.names_for(Mixtral)
class MixtralGgufNames(LlamaGgufNames):
  """llama.cpp's `llama` with experts (`expert_count`): Llama's names, each layer's feed-forward
  the router (`ffn_gate_inp`) and the stacked experts."""

  @classmethod
  def reads_file(cls, metadata: Mapping[str, Any]) -> bool:
    return bool(metadata.get(f"{metadata.get('general.architecture')}.expert_count"))

  @classmethod
  def hf_config(cls, metadata: Mapping[str, Any],
                tensors: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    arch = metadata["general.architecture"]
    config = super().hf_config(metadata, tensors)
    config.update(num_local_experts=metadata.get(f"{arch}.expert_count"),
                  num_experts_per_tok=metadata.get(f"{arch}.expert_used_count"))
    config.setdefault("rope_theta", 1000000.0)
    return {name: value for name, value in config.items() if value is not None}

  def metadata(self) -> dict[str, int | float | str]:
    model = self.model
    return {**super().metadata(), "feed_forward_length": model.resolved_expert_mlp_dim,
            "expert_count": model.num_experts, "expert_used_count": model.experts_per_token}

  def tensors(self) -> dict[str, GgufTensor]:
    model = self.model
    names = {name: tensor for name, tensor in super().tensors().items()
             if ".ffn_gate." not in name and ".ffn_up." not in name and ".ffn_down." not in name}
    for index in range(model.num_layers):
      gguf, hf = f"blk.{index}.", f"model.layers.{index}.block_sparse_moe."
      names[f"{gguf}ffn_gate_inp.weight"] = GgufTensor(f"{hf}gate.weight")
      for kind, projection in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
        names[f"{gguf}ffn_{kind}_exps.weight"] = GgufTensor(
            f"{hf}experts.{{expert}}.{projection}.weight", experts=model.num_experts)
    return names
