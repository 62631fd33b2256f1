"""Qwen3-MoE: Qwen3's attention (a query and key RMSNorm per head, a head width of its own) with
a mixture of experts: 128 SwiGLU experts of their own width, 8 per token (Qwen3-30B-A3B).

Whether the chosen 8 weights are renormalized to sum to 1 is the config's `norm_topk_prob`
(true in the released models, false by default in transformers' config), read as
`renormalize_top_k`. Which layers are MoE is Hugging Face's rule: layer i is sparse unless it
is listed in `mlp_only_layers` or (i + 1) is not a multiple of `decoder_sparse_step`; the other
layers are dense SwiGLU MLPs of `intermediate_size` (our `mlp_dim`), the experts
`moe_intermediate_size` wide (`expert_mlp_dim`). The rule reads as a pattern of feed-forward
kinds (`mlp_kinds`), which scanned layers step over. With `use_sliding_window`, every layer
slides (transformers' Qwen3-MoE has no `max_window_layers`).

Hugging Face (`Qwen3MoeForCausalLM`, model_type "qwen3_moe") stores the router as `mlp.gate` and
each expert's gate_proj (our `wi`), up_proj (`wi_gate`) and down_proj (`wo`) on their own;
llama.cpp's `qwen3moe` stacks them (`ffn_{gate,up,down}_exps`) and has no dense layers and no
setting for the renormalization (it always renormalizes): a model with either is refused as a
GGUF file in one line.
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.errors import UsageError
from lingvo_lite.fields import PositiveFloat, PositiveInt
from lingvo_lite.models import format_names, layers
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.checkpoint_names import (GgufTensor, HfConfig, TensorName,
                                                 dense, gguf_config, linear_attention, norm)
from lingvo_lite.models.moe_names import MoeHfNames, per_expert, router_aux_loss
from lingvo_lite.models.moe_transformer import MoeTransformerLM
from lingvo_lite.models.qwen3 import Qwen3GgufNames
from lingvo_lite.models.transformer import PositionKind
from lingvo_lite.models.transformer_layers import pattern_of
from lingvo_lite.models.transformer_names import rope_scaling, rotary_scaling_fields

_PROJECTIONS = (("gate_proj", "wi"), ("up_proj", "wi_gate"), ("down_proj", "wo"))


class Qwen3Moe(MoeTransformerLM):
  """Qwen3-MoE: `MoeTransformerLM`'s fields (their docs are there and `TransformerLM`'s) with
  Qwen3-MoE's choices as defaults."""

  block: BlockKind = "sequential"
  norm: layers.NormKind = "rmsnorm"
  norm_eps: PositiveFloat = 1e-6
  mlp_activation: layers.Activation = "swiglu"
  position: PositionKind = "rotary"
  rotary_style: layers.RotaryStyle = "half"
  rotary_base: PositiveFloat = 1000000.0
  qk_norm: layers.QkNorm = "head"
  num_experts: PositiveInt = 128
  experts_per_token: PositiveInt = 8

  family_name = "qwen3_moe"
  same_model_as = ()


def sparse_layers(config: HfConfig, layers_count: int) -> tuple[str, ...]:
  """Each layer's feed-forward kind by Hugging Face's rule (the module doc)."""
  step = config.get("decoder_sparse_step", 1)
  dense_layers = config.get("mlp_only_layers", [])
  if not isinstance(step, int) or isinstance(step, bool) or step < 1:
    raise config.refuse("decoder_sparse_step", step, "must be a positive integer",
                        "fix the file")
  if not isinstance(dense_layers, list) or not all(
      isinstance(i, int) and not isinstance(i, bool) for i in dense_layers):
    raise config.refuse("mlp_only_layers", dense_layers, "must be a list of layer indices",
                        "fix the file")
  return tuple("moe" if index not in dense_layers and (index + 1) % step == 0 else "dense"
               for index in range(layers_count))


@format_names.names_for(Qwen3Moe)
class Qwen3MoeHfNames(MoeHfNames):
  """Qwen3-MoE's Hugging Face names."""

  model_type = "qwen3_moe"
  architecture = "Qwen3MoeForCausalLM"

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    config.expect("hidden_act", ("silu",), "silu")
    layers_count = config.require("num_hidden_layers")
    # transformers 5 saves `num_experts` as `num_local_experts` (its attribute map).
    experts = config.get("num_experts", config.get("num_local_experts", 128))
    if experts == 0:
      raise config.refuse("num_experts", 0, "a Qwen3-MoE without experts is a dense Qwen3",
                          "use its Qwen3 config (model_type 'qwen3')")
    window = config.get("sliding_window") if config.flag("use_sliding_window", False) else None
    kinds = sparse_layers(config, layers_count)
    max_length = config.get("max_position_embeddings", 32768)
    return {
        "vocab_size": config.require("vocab_size"),
        "num_layers": layers_count,
        "dim": config.require("hidden_size"),
        "num_heads": config.require("num_attention_heads"),
        "num_kv_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("head_dim"),
        "mlp_dim": config.require("intermediate_size"),
        "expert_mlp_dim": config.get("moe_intermediate_size", 768),
        "num_experts": experts,
        "experts_per_token": config.get("num_experts_per_tok", 8),
        "renormalize_top_k": config.flag("norm_topk_prob", False),
        "mlp_kinds": pattern_of(kinds),
        "norm_eps": config.number("rms_norm_eps", 1e-6),
        "rotary_base": config.rope_theta(1000000.0),
        "max_length": max_length,
        "tie_embeddings": config.flag("tie_word_embeddings", False),
        "attention_bias": config.flag("attention_bias", False),
        "layer_kinds": ("sliding",) if window is not None else ("full",),
        "window": window,
        **router_aux_loss(config),
        **rotary_scaling_fields(config, config.rope_scaling(), "rope_scaling",
                                max_length=max_length),
    }

  def config(self) -> dict[str, Any]:
    model = self.model
    sliding = "sliding" in model.kinds_by_layer()
    kinds = model.mlp_kinds_by_layer()
    return {
        "model_type": self.model_type, "architectures": [self.architecture],
        "vocab_size": model.vocab_size, "num_hidden_layers": model.num_layers,
        "hidden_size": model.dim, "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.resolved_num_kv_heads, "head_dim": model.resolved_head_dim,
        "intermediate_size": model.resolved_mlp_dim,
        "moe_intermediate_size": model.resolved_expert_mlp_dim, "hidden_act": "silu",
        "num_experts": model.num_experts, "num_experts_per_tok": model.experts_per_token,
        "norm_topk_prob": model.renormalize_top_k, "decoder_sparse_step": 1,
        "mlp_only_layers": [index for index, kind in enumerate(kinds) if kind == "dense"],
        "router_aux_loss_coef": model.load_balance_coefficient, "output_router_logits": False,
        "rms_norm_eps": model.norm_eps, "rope_theta": model.rotary_base,
        "max_position_embeddings": model.max_length, "attention_bias": model.attention_bias,
        "use_sliding_window": sliding, "sliding_window": model.window if sliding else None,
        "tie_word_embeddings": model.tie_embeddings,
        **({} if model.rotary_scaling == "none" else {
            "rope_scaling": rope_scaling(model.rotary_scaling_settings("full"))}),
    }

  def tensors(self) -> list[TensorName]:
    model = self.model
    kinds = model.mlp_kinds_by_layer()
    names = [TensorName("model.embed_tokens.weight", ("embedding",), transposed=False)]
    for index in range(model.num_layers):
      hf, ours = f"model.layers.{index}.", f"layer_{index}/"
      names += norm(f"{hf}input_layernorm", f"{ours}attention_norm", False)
      names += linear_attention(f"{hf}self_attn.", f"{ours}attention/",
                                ("q_proj", "k_proj", "v_proj", "o_proj"), model.attention_bias)
      names += norm(f"{hf}self_attn.q_norm", f"{ours}attention/query_norm", False)
      names += norm(f"{hf}self_attn.k_norm", f"{ours}attention/key_norm", False)
      names += norm(f"{hf}post_attention_layernorm", f"{ours}mlp_norm", False)
      if kinds[index] == "moe":
        names.append(TensorName(f"{hf}mlp.gate.weight", (f"{ours}mlp/router_kernel",)))
        names += per_expert(f"{hf}mlp.experts.", f"{ours}mlp/", model.num_experts,
                            _PROJECTIONS)
      else:
        for projection, parameter in _PROJECTIONS:
          names += dense(f"{hf}mlp.{projection}", f"{ours}mlp/{parameter}", False)
    names += norm("model.norm", "final_norm", False)
    if not model.tie_embeddings:
      names += dense("lm_head", "output", False)
    return names


@format_names.names_for(Qwen3Moe)
class Qwen3MoeGgufNames(Qwen3GgufNames):
  """llama.cpp's `qwen3moe`: Qwen3's names (the query and key norms, rows as they are), each
  layer's feed-forward the router and the stacked experts."""

  architecture = "qwen3moe"

  @classmethod
  def reads_file(cls, metadata: Mapping[str, Any]) -> bool:
    del metadata
    return True

  @classmethod
  def hf_config(cls, metadata: Mapping[str, Any],
                tensors: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    config = super().hf_config(metadata, tensors)
    config.update(gguf_config(metadata, {
        "num_experts": "expert_count", "num_experts_per_tok": "expert_used_count",
        "moe_intermediate_size": "expert_feed_forward_length"}))
    # llama.cpp's qwen3moe renormalizes the chosen experts' weights whatever the file says.
    config.update(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    config.setdefault("rope_theta", 1000000.0)
    return config

  def check_writable(self) -> None:
    model = self.model
    if "dense" in model.mlp_kinds_by_layer():
      raise UsageError("model: a qwen3_moe model with dense layers (Hugging Face's "
                       "mlp_only_layers): llama.cpp's qwen3moe makes every layer a mixture "
                       "of experts; export --export_format=hf")
    if not model.renormalize_top_k:
      raise UsageError("model.renormalize_top_k=False (Hugging Face's norm_topk_prob): "
                       "llama.cpp's qwen3moe always renormalizes the chosen experts' weights; "
                       "export --export_format=hf")
    super().check_writable()

  def metadata(self) -> dict[str, int | float | str]:
    model = self.model
    return {**super().metadata(), "expert_count": model.num_experts,
            "expert_used_count": model.experts_per_token,
            "expert_feed_forward_length": model.resolved_expert_mlp_dim}

  def tensors(self) -> dict[str, GgufTensor]:
    model = self.model
    names = {name: tensor for name, tensor in super().tensors().items()
             if ".ffn_gate." not in name and ".ffn_up." not in name and ".ffn_down." not in name}
    for index in range(model.num_layers):
      gguf, hf = f"blk.{index}.", f"model.layers.{index}.mlp."
      names[f"{gguf}ffn_gate_inp.weight"] = GgufTensor(f"{hf}gate.weight")
      for kind, projection in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
        names[f"{gguf}ffn_{kind}_exps.weight"] = GgufTensor(
            f"{hf}experts.{{expert}}.{projection}.weight", experts=model.num_experts)
    return names
