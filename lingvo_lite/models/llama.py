"""Llama: the shared transformer with Llama's choices as its defaults.

Sequential pre-RMSNorm blocks, a SwiGLU MLP, rotate-half rotary embedding on every dim of each
head, grouped-query attention where `num_kv_heads` is set, and no biases. Experiments give the
sizes: `fdl.Config(Llama, vocab_size=32000, num_layers=32, dim=4096, ...)`, or take them from
a Hugging Face folder (`LlamaHfNames.fields`, weights/hf_checkpoint.py).

Hugging Face's Llama rotates halves of each head (`rotate_half`), as `rotary_style="half"`
does, so its query and key weights load as they are; its SwiGLU is down(silu(gate(x)) * up(x)),
our `wi` (activated) and `wi_gate` (multiplied).
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.errors import UsageError
from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import format_names, layers
from lingvo_lite.models.checkpoint_names import (GgufTensor, HfConfig, TensorName,
                                                 dense, gguf_config, linear_attention, norm)
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.transformer import PositionKind, TransformerLM
from lingvo_lite.models.transformer_names import (TransformerGgufNames, TransformerHfNames,
                                                  rope_scaling, rotary_scaling_fields)


class Llama(TransformerLM):
  """Llama: `TransformerLM`'s fields (their docs are there), with Llama's choices as defaults."""

  block: BlockKind = "sequential"
  norm: layers.NormKind = "rmsnorm"
  norm_eps: PositiveFloat = 1e-5
  mlp_activation: layers.Activation = "swiglu"
  position: PositionKind = "rotary"
  rotary_style: layers.RotaryStyle = "half"
  attention_bias: bool = False
  mlp_bias: bool = False
  embedding_bias: bool = False
  tie_embeddings: bool = False
  output_bias: bool = False

  family_name = "llama"
  same_model_as = ("lingvo_lite.models.transformer.TransformerLM",)


@format_names.names_for(Llama)
class LlamaHfNames(TransformerHfNames):
  """Llama's Hugging Face names."""

  model_type = "llama"
  architecture = "LlamaForCausalLM"

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    config.expect("hidden_act", ("silu",), "silu")
    if config.get("sliding_window") is not None and config.get("use_sliding_window", True):
      raise config.refuse("sliding_window", config.get("sliding_window"),
                          f"the {cls.family.family_name} family attends to the whole context",
                          "use a Mistral config (model_type 'mistral') for a sliding window")
    max_length = config.get("max_position_embeddings", 2048)
    return {
        "vocab_size": config.require("vocab_size"),
        "num_layers": config.require("num_hidden_layers"),
        "dim": config.require("hidden_size"),
        "num_heads": config.require("num_attention_heads"),
        "num_kv_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("head_dim"),
        "mlp_dim": config.require("intermediate_size"),
        "norm_eps": config.number("rms_norm_eps", 1e-6),
        "rotary_base": config.rope_theta(),
        "max_length": max_length,
        "tie_embeddings": config.flag("tie_word_embeddings", False),
        "attention_bias": config.flag("attention_bias", False),
        "mlp_bias": config.flag("mlp_bias", False),
        **rotary_scaling_fields(config, config.rope_scaling(), "rope_scaling",
                                max_length=max_length),
    }

  def config(self) -> dict[str, Any]:
    model = self.model
    return {
        "model_type": self.model_type, "architectures": [self.architecture],
        "vocab_size": model.vocab_size, "num_hidden_layers": model.num_layers,
        "hidden_size": model.dim, "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.resolved_num_kv_heads, "head_dim": model.resolved_head_dim,
        "intermediate_size": model.resolved_mlp_dim, "hidden_act": "silu",
        "rms_norm_eps": model.norm_eps, "rope_theta": model.rotary_base,
        "max_position_embeddings": model.max_length,
        "tie_word_embeddings": model.tie_embeddings, "attention_bias": model.attention_bias,
        "mlp_bias": model.mlp_bias,
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
                                ("q_proj", "k_proj", "v_proj", "o_proj"), model.attention_bias)
      names += norm(f"{hf}post_attention_layernorm", f"{ours}mlp_norm", False)
      names += dense(f"{hf}mlp.gate_proj", f"{ours}mlp/wi", model.mlp_bias)
      names += dense(f"{hf}mlp.up_proj", f"{ours}mlp/wi_gate", model.mlp_bias)
      names += dense(f"{hf}mlp.down_proj", f"{ours}mlp/wo", model.mlp_bias)
    names += norm("model.norm", "final_norm", False)
    if not model.tie_embeddings:
      names += dense("lm_head", "output", False)
    return names


@format_names.names_for(Llama)
class LlamaGgufNames(TransformerGgufNames):
  """llama.cpp's `llama`: each head's query and key rows hold their rotary pairs side by side
  (GGML's rope), where Hugging Face's rotate-half keeps the halves apart."""

  architecture = "llama"

  @classmethod
  def reads_file(cls, metadata: Mapping[str, Any]) -> bool:
    """A `llama` file without experts (one with `expert_count` is Mixtral's)."""
    return not metadata.get(f"{metadata.get('general.architecture')}.expert_count")

  @classmethod
  def hf_config(cls, metadata: Mapping[str, Any],
                tensors: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The Hugging Face config.json a llama.cpp GGUF file's metadata describes (its keys are
    `<architecture>.*`; tied embeddings where the file has no `output.weight`)."""
    arch = metadata["general.architecture"]
    scaling = metadata.get(f"{arch}.rope.scaling.type")
    config = {
        "model_type": cls.hf_model_type(), "rope_theta": 10000.0,
        "vocab_size": tensors.get("token_embd.weight", (None,))[0],  # Unless the file says.
        **gguf_config(metadata, {
            "vocab_size": "vocab_size", "num_hidden_layers": "block_count",
            "hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
            "num_attention_heads": "attention.head_count",
            "num_key_value_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
            "rms_norm_eps": "attention.layer_norm_rms_epsilon", "rope_theta": "rope.freq_base",
            "max_position_embeddings": "context_length"}),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    if scaling not in (None, "none"):
      config["rope_scaling"] = {"rope_type": scaling}
    if "rope_freqs.weight" in tensors:
      raise UsageError(f"{arch}: the file scales its rotary frequencies by a rope_freqs tensor "
                       "(Llama 3.1's scaling as llama.cpp stores it), which lingvo_lite does "
                       "not read yet; use the model's Hugging Face folder (hf:PATH)")
    return {name: value for name, value in config.items() if value is not None}

  def check_writable(self) -> None:
    """Refuses rotary scaling: llama.cpp stores Llama 3.1's as a rope_freqs tensor, which this
    writer does not make."""
    if self.model.rotary_scaling != "none":
      raise UsageError(f"model: rope scaling {self.model.rotary_scaling!r}: this GGUF writer "
                       "does not store it (llama.cpp's rope_freqs tensor); export "
                       "--export_format=hf")

  def metadata(self) -> dict[str, int | float | str]:
    model = self.model
    return {**super().metadata(),
            "attention.head_count_kv": model.resolved_num_kv_heads,
            "attention.key_length": model.resolved_head_dim,
            "attention.value_length": model.resolved_head_dim,
            "rope.dimension_count": model.resolved_head_dim,
            "attention.layer_norm_rms_epsilon": float(model.norm_eps),
            "rope.freq_base": float(model.rotary_base)}

  def tensors(self) -> dict[str, GgufTensor]:
    model = self.model
    if model.attention_bias or model.mlp_bias:
      raise UsageError("model: a GGUF llama with attention or MLP biases is not read yet; "
                       "use its Hugging Face folder (hf:PATH)")
    names = {"token_embd.weight": GgufTensor("model.embed_tokens.weight"),
             "output_norm.weight": GgufTensor("model.norm.weight")}
    if not model.tie_embeddings:
      names["output.weight"] = GgufTensor("lm_head.weight")
    for index in range(model.num_layers):
      gguf, hf = f"blk.{index}.", f"model.layers.{index}."
      names.update({
          f"{gguf}attn_norm.weight": GgufTensor(f"{hf}input_layernorm.weight"),
          f"{gguf}attn_q.weight": GgufTensor(f"{hf}self_attn.q_proj.weight", model.num_heads),
          f"{gguf}attn_k.weight": GgufTensor(f"{hf}self_attn.k_proj.weight",
                                             model.resolved_num_kv_heads),
          f"{gguf}attn_v.weight": GgufTensor(f"{hf}self_attn.v_proj.weight"),
          f"{gguf}attn_output.weight": GgufTensor(f"{hf}self_attn.o_proj.weight"),
          f"{gguf}ffn_norm.weight": GgufTensor(f"{hf}post_attention_layernorm.weight"),
          f"{gguf}ffn_gate.weight": GgufTensor(f"{hf}mlp.gate_proj.weight"),
          f"{gguf}ffn_up.weight": GgufTensor(f"{hf}mlp.up_proj.weight"),
          f"{gguf}ffn_down.weight": GgufTensor(f"{hf}mlp.down_proj.weight"),
      })
    return names
