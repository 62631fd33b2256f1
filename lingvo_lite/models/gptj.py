"""GPT-J (mesh-transformer-jax): the shared transformer with GPT-J's choices as its defaults.

A parallel block with one LayerNorm, interleaved rotary on part of each head, no attention
biases, a biased MLP with tanh GELU, a biased embedding and an untied, biased output.
Experiments give the sizes: `fdl.Config(GptJ, vocab_size=50400, num_layers=28, dim=4096, ...)`.

Hugging Face's GPT-J rotates pairs of the first `rotary_dim` dims of each head
(`rotate_every_two`), as `rotary_style="interleaved"` does, so its query and key weights load
as they are. It has no embedding bias (mesh-transformer-jax's is folded into the rows when
converted): ours is zero in the model it describes. llama.cpp's GGUF `gptj` keeps the same
tensors in the same layout (GGML's default rope also rotates adjacent pairs); transformers reads
no GPT-J GGUF, so lingvo_lite's reader is the other end of its export. `GptJHfNames` and
`GptJGgufNames` are its names in those formats (models/format_names.py).
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import format_names, layers
from lingvo_lite.models.checkpoint_names import (GgufTensor, HfConfig, TensorName, dense,
                                                 gguf_config, linear_attention, norm)
from lingvo_lite.models.gpt2 import GPT_GGUF_KEYS
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.transformer import PositionKind, TransformerLM
from lingvo_lite.models.transformer_names import TransformerGgufNames, TransformerHfNames


class GptJ(TransformerLM):
  """GPT-J: `TransformerLM`'s fields (their docs are there), with GPT-J's choices as defaults."""

  block: BlockKind = "parallel"
  norm: layers.NormKind = "layernorm"
  norm_eps: PositiveFloat = 1e-5
  mlp_activation: layers.Activation = "gelu_tanh"
  position: PositionKind = "rotary"
  rotary_style: layers.RotaryStyle = "interleaved"
  attention_bias: bool = False
  mlp_bias: bool = True
  embedding_bias: bool = True
  tie_embeddings: bool = False
  output_bias: bool = True

  family_name = "gptj"
  same_model_as = ("lingvo_lite.models.transformer.TransformerLM",)


@format_names.names_for(GptJ)
class GptJHfNames(TransformerHfNames):
  """GPT-J's Hugging Face names."""

  model_type = "gptj"
  architecture = "GPTJForCausalLM"

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    config.expect("activation_function", ("gelu_new",), "gelu_new")
    config.expect("tie_word_embeddings", (False,), False)
    return {
        "vocab_size": config.require("vocab_size"),
        "num_layers": config.require("n_layer"),
        "dim": config.require("n_embd"),
        "num_heads": config.require("n_head"),
        "rotary_dim": config.get("rotary_dim"),
        "mlp_dim": config.get("n_inner"),
        "norm_eps": config.number("layer_norm_epsilon", 1e-5),
        "max_length": config.get("n_positions", 2048),
    }

  def config(self) -> dict[str, Any]:
    model = self.model
    return {
        "model_type": self.model_type, "architectures": [self.architecture],
        "vocab_size": model.vocab_size, "n_layer": model.num_layers, "n_embd": model.dim,
        "n_head": model.num_heads, "rotary_dim": model.resolved_rotary_dim,
        "n_inner": model.resolved_mlp_dim, "layer_norm_epsilon": model.norm_eps,
        "n_positions": model.max_length, "activation_function": "gelu_new",
        "tie_word_embeddings": False,
    }

  def export_params(self, params: dict[str, Any]) -> dict[str, Any]:
    """The embedding bias folded into the rows (E[t] + b = (E + b)[t]), as
    mesh-transformer-jax's conversion does: the format has no tensor for it."""
    bias = params["embedding_bias"]
    return dict(params, embedding=params["embedding"] + bias[None, :],
                embedding_bias=bias * 0)

  def tensors(self) -> list[TensorName]:
    names = [TensorName("transformer.wte.weight", ("embedding",), transposed=False)]
    for index in range(self.model.num_layers):
      hf, ours = f"transformer.h.{index}.", f"layer_{index}/"
      names += norm(f"{hf}ln_1", f"{ours}norm", True)
      names += linear_attention(f"{hf}attn.", f"{ours}attention/",
                                ("q_proj", "k_proj", "v_proj", "out_proj"), False)
      names += dense(f"{hf}mlp.fc_in", f"{ours}mlp/wi", True)
      names += dense(f"{hf}mlp.fc_out", f"{ours}mlp/wo", True)
    return names + norm("transformer.ln_f", "final_norm", True) + dense("lm_head", "output", True)

  def absent(self) -> tuple[str, ...]:
    return ("embedding_bias",)


@format_names.names_for(GptJ)
class GptJGgufNames(TransformerGgufNames):
  """llama.cpp's `gptj`: the Hugging Face tensors in the same layout."""

  architecture = "gptj"

  @classmethod
  def hf_config(cls, metadata: Mapping[str, Any],
                tensors: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The config.json of llama.cpp's `gptj` metadata (the vocabulary: the token table's
    rows)."""
    return {"model_type": cls.hf_model_type(),
            **gguf_config(metadata, {**GPT_GGUF_KEYS, "rotary_dim": "rope.dimension_count"}),
            "vocab_size": tensors.get("token_embd.weight", (None,))[0]}

  def metadata(self) -> dict[str, int | float | str]:
    return {**super().metadata(), "rope.dimension_count": self.model.resolved_rotary_dim,
            "attention.layer_norm_epsilon": float(self.model.norm_eps)}

  def tensors(self) -> dict[str, GgufTensor]:
    names = {"token_embd.weight": GgufTensor("transformer.wte.weight"),
             "output_norm.weight": GgufTensor("transformer.ln_f.weight"),
             "output_norm.bias": GgufTensor("transformer.ln_f.bias"),
             "output.weight": GgufTensor("lm_head.weight"),
             "output.bias": GgufTensor("lm_head.bias")}
    for index in range(self.model.num_layers):
      gguf, hf = f"blk.{index}.", f"transformer.h.{index}."
      names.update({
          f"{gguf}attn_norm.weight": GgufTensor(f"{hf}ln_1.weight"),
          f"{gguf}attn_norm.bias": GgufTensor(f"{hf}ln_1.bias"),
          f"{gguf}attn_q.weight": GgufTensor(f"{hf}attn.q_proj.weight"),
          f"{gguf}attn_k.weight": GgufTensor(f"{hf}attn.k_proj.weight"),
          f"{gguf}attn_v.weight": GgufTensor(f"{hf}attn.v_proj.weight"),
          f"{gguf}attn_output.weight": GgufTensor(f"{hf}attn.out_proj.weight"),
          f"{gguf}ffn_up.weight": GgufTensor(f"{hf}mlp.fc_in.weight"),
          f"{gguf}ffn_up.bias": GgufTensor(f"{hf}mlp.fc_in.bias"),
          f"{gguf}ffn_down.weight": GgufTensor(f"{hf}mlp.fc_out.weight"),
          f"{gguf}ffn_down.bias": GgufTensor(f"{hf}mlp.fc_out.bias"),
      })
    return names
