"""GPT-2: the shared transformer with GPT-2's choices as its defaults.

Sequential pre-LayerNorm blocks, learned absolute positions (`max_length` rows), tanh GELU,
biases everywhere, and the output projection tied to the token embedding. Experiments give
the sizes: `fdl.Config(Gpt2, vocab_size=50304, num_layers=12, dim=768, ...)`.

Hugging Face's GPT-2 stores its projections as `Conv1D`s ([in, out], no transpose) and packs
query, key and value along the output of one `c_attn`; its tied head computes
ln_f(x) @ wte^T unscaled (`tied_output_scale="one"`). Files from the Hub may lack the
`transformer.` prefix of the names transformers writes. llama.cpp's GGUF `gpt2` stores the
same tensors, the `Conv1D` matrices transposed to [out, in].
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import format_names, layers
from lingvo_lite.models.checkpoint_names import (GgufTensor, HfConfig, TensorName,
                                                 dense, gguf_config, norm)
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.transformer import PositionKind, TransformerLM
from lingvo_lite.models.transformer_names import TransformerGgufNames, TransformerHfNames


# config.json keys of GPT-2 (and GPT-J, which names them alike) -> llama.cpp's metadata keys.
GPT_GGUF_KEYS = {"n_layer": "block_count", "n_embd": "embedding_length",
                 "n_inner": "feed_forward_length", "n_head": "attention.head_count",
                 "layer_norm_epsilon": "attention.layer_norm_epsilon",
                 "n_positions": "context_length"}


class Gpt2(TransformerLM):
  """GPT-2: `TransformerLM`'s fields (their docs are there), with GPT-2's choices as defaults."""

  block: BlockKind = "sequential"
  norm: layers.NormKind = "layernorm"
  norm_eps: PositiveFloat = 1e-5
  mlp_activation: layers.Activation = "gelu_tanh"
  position: PositionKind = "learned"
  attention_bias: bool = True
  mlp_bias: bool = True
  embedding_bias: bool = False
  tie_embeddings: bool = True
  output_bias: bool = False

  family_name = "gpt2"
  same_model_as = ("lingvo_lite.models.transformer.TransformerLM",)


@format_names.names_for(Gpt2)
class Gpt2HfNames(TransformerHfNames):
  """GPT-2's Hugging Face names: `Conv1D` matrices stored [in, out], query, key and value in
  one `c_attn`."""

  model_type = "gpt2"
  architecture = "GPT2LMHeadModel"
  optional_prefix = "transformer."

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    config.expect("activation_function", ("gelu_new",), "gelu_new")
    config.expect("scale_attn_weights", (True,), True)
    config.expect("scale_attn_by_inverse_layer_idx", (False,), False)
    return {
        "vocab_size": config.require("vocab_size"),
        "num_layers": config.require("n_layer"),
        "dim": config.require("n_embd"),
        "num_heads": config.require("n_head"),
        "mlp_dim": config.get("n_inner"),
        "norm_eps": config.number("layer_norm_epsilon", 1e-5),
        "max_length": config.get("n_positions", 1024),
        "tie_embeddings": config.flag("tie_word_embeddings", True),
    }

  def config(self) -> dict[str, Any]:
    model = self.model
    return {
        "model_type": self.model_type, "architectures": [self.architecture],
        "vocab_size": model.vocab_size, "n_layer": model.num_layers, "n_embd": model.dim,
        "n_head": model.num_heads, "n_inner": model.resolved_mlp_dim,
        "layer_norm_epsilon": model.norm_eps, "n_positions": model.max_length,
        "activation_function": "gelu_new", "tie_word_embeddings": model.tie_embeddings,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
    }

  def tensors(self) -> list[TensorName]:
    names = [TensorName("transformer.wte.weight", ("embedding",), transposed=False),
             TensorName("transformer.wpe.weight", ("position_embedding",), transposed=False)]
    for index in range(self.model.num_layers):
      hf, ours = f"transformer.h.{index}.", f"layer_{index}/"
      attention = f"{ours}attention/"
      names += norm(f"{hf}ln_1", f"{ours}attention_norm", True)
      names += [TensorName(f"{hf}attn.c_attn.weight", tuple(f"{attention}{kind}_kernel" for kind
                                                           in ("query", "key", "value")),
                           1, False),
                TensorName(f"{hf}attn.c_attn.bias", tuple(f"{attention}{kind}_bias" for kind
                                                         in ("query", "key", "value")),
                           0, False),
                TensorName(f"{hf}attn.c_proj.weight", (f"{attention}out_kernel",), 2, False),
                TensorName(f"{hf}attn.c_proj.bias", (f"{attention}out_bias",), 0, False)]
      names += norm(f"{hf}ln_2", f"{ours}mlp_norm", True)
      names += dense(f"{hf}mlp.c_fc", f"{ours}mlp/wi", True, transposed=False)
      names += dense(f"{hf}mlp.c_proj", f"{ours}mlp/wo", True, transposed=False)
    names += norm("transformer.ln_f", "final_norm", True)
    if not self.model.tie_embeddings:
      names += dense("lm_head", "output", False)
    return names


@format_names.names_for(Gpt2)
class Gpt2GgufNames(TransformerGgufNames):
  """llama.cpp's `gpt2`: the Hugging Face tensors, the `Conv1D` matrices transposed."""

  architecture = "gpt2"

  @classmethod
  def hf_config(cls, metadata: Mapping[str, Any],
                tensors: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The config.json of llama.cpp's `gpt2` metadata; the vocabulary is the token table's
    rows (llama.cpp's converter writes no `gpt2.vocab_size`). Its converter writes the tied
    head again as output.weight: equal to the table, read as an untied copy."""
    return {"model_type": cls.hf_model_type(), **gguf_config(metadata, GPT_GGUF_KEYS),
            "vocab_size": tensors.get("token_embd.weight", (None,))[0],
            "tie_word_embeddings": "output.weight" not in tensors}

  def metadata(self) -> dict[str, int | float | str]:
    return {**super().metadata(), "attention.layer_norm_epsilon": float(self.model.norm_eps)}

  def tensors(self) -> dict[str, GgufTensor]:
    names = {"token_embd.weight": GgufTensor("transformer.wte.weight"),
             "position_embd.weight": GgufTensor("transformer.wpe.weight"),
             "output_norm.weight": GgufTensor("transformer.ln_f.weight"),
             "output_norm.bias": GgufTensor("transformer.ln_f.bias")}
    if not self.model.tie_embeddings:
      names["output.weight"] = GgufTensor("lm_head.weight")
    for index in range(self.model.num_layers):
      gguf, hf = f"blk.{index}.", f"transformer.h.{index}."
      for ours, theirs, transposed in (("attn_norm", "ln_1", False),
                                       ("attn_qkv", "attn.c_attn", True),
                                       ("attn_output", "attn.c_proj", True),
                                       ("ffn_norm", "ln_2", False),
                                       ("ffn_up", "mlp.c_fc", True),
                                       ("ffn_down", "mlp.c_proj", True)):
        names[f"{gguf}{ours}.weight"] = GgufTensor(f"{hf}{theirs}.weight",
                                                   transposed=transposed)
        names[f"{gguf}{ours}.bias"] = GgufTensor(f"{hf}{theirs}.bias")
    return names
