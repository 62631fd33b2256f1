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

from lingvo_lite.models import format_names
from lingvo_lite.models.config_rows import NUMBER, Fixed, Key, Rows
from lingvo_lite.models.dense_names import tied
from lingvo_lite.models.tensor_rows import Tensor, dense, has, norm, vector
from lingvo_lite.models.transformer import PositionKind, TransformerLM
from lingvo_lite.models.transformer_names import TransformerGgufNames, TransformerHfNames


# config.json's keys of GPT-2 (and GPT-J, which names them alike) and llama.cpp's; llama.cpp's
# converter writes no vocabulary size for GPT-2: the vocabulary is the token table's rows.
CONFIG = Rows((
    Fixed("activation_function", "gelu_new"),
    Key("vocab_size", "vocab_size", "vocab_size", gguf_reads=False),
    Key("num_layers", "n_layer", "block_count"),
    Key("dim", "n_embd", "embedding_length"),
    Key("num_heads", "n_head", "attention.head_count"),
    Key("mlp_dim", "n_inner", "feed_forward_length", None, source="resolved_mlp_dim"),
    Key("norm_eps", "layer_norm_epsilon", "attention.layer_norm_epsilon", 1e-5, NUMBER),
    Key("max_length", "n_positions", "context_length", 1024),
))
# GPT-2's and GPT-J's layer prefix, their token table and final LayerNorm.
LAYER = "transformer.h.{i}."
TOKENS = Tensor("embedding", "transformer.wte.weight", "token_embd.weight", table=True)
FINAL_NORM = norm("final_norm", "transformer.ln_f", "output_norm", bias=True)


class Gpt2(TransformerLM):
  """GPT-2: `TransformerLM`'s fields (their docs are there), with GPT-2's choices as defaults
  where they are not `TransformerLM`'s (sequential pre-LayerNorm blocks, tanh GELU)."""

  position: PositionKind = "learned"
  attention_bias: bool = True
  mlp_bias: bool = True
  tie_embeddings: bool = True

  family_name = "gpt2"
  same_model_as = ("lingvo_lite.models.transformer.TransformerLM",)


@format_names.names_for(Gpt2)
class Gpt2HfNames(TransformerHfNames):
  """GPT-2's Hugging Face names: `Conv1D` matrices stored [in, out], query, key and value in
  one `c_attn`."""

  model_type = "gpt2"
  architecture = "GPT2LMHeadModel"
  optional_prefix = "transformer."
  config_rows = CONFIG.changed(Fixed("scale_attn_weights", True),
                               Fixed("scale_attn_by_inverse_layer_idx", False), tied(True))
  tensor_rows = (
      TOKENS,
      Tensor("position_embedding", "transformer.wpe.weight", "position_embd.weight",
             table=True),
      *norm("layer_{i}/attention_norm", f"{LAYER}ln_1", "blk.{i}.attn_norm", bias=True),
      Tensor(tuple(f"layer_{{i}}/attention/{kind}_kernel" for kind in ("query", "key", "value")),
             f"{LAYER}attn.c_attn.weight", "blk.{i}.attn_qkv.weight", transposed=False),
      vector(tuple(f"layer_{{i}}/attention/{kind}_bias" for kind in ("query", "key", "value")),
             f"{LAYER}attn.c_attn.bias", "blk.{i}.attn_qkv.bias"),
      Tensor("layer_{i}/attention/out_kernel", f"{LAYER}attn.c_proj.weight",
             "blk.{i}.attn_output.weight", 2, transposed=False),
      vector("layer_{i}/attention/out_bias", f"{LAYER}attn.c_proj.bias",
             "blk.{i}.attn_output.bias"),
      *norm("layer_{i}/mlp_norm", f"{LAYER}ln_2", "blk.{i}.ffn_norm", bias=True),
      *dense("layer_{i}/mlp/wi", f"{LAYER}mlp.c_fc", "blk.{i}.ffn_up", True, False, True),
      *dense("layer_{i}/mlp/wo", f"{LAYER}mlp.c_proj", "blk.{i}.ffn_down", True, False, True),
      *FINAL_NORM,
      Tensor("output/kernel", "lm_head.weight", "output.weight",
             when=has("tie_embeddings", False)))


@format_names.names_for(Gpt2)
class Gpt2GgufNames(TransformerGgufNames):
  """llama.cpp's `gpt2`: the Hugging Face tensors, the `Conv1D` matrices transposed. Its
  converter writes the tied head again as output.weight: equal to the table, read as an
  untied copy."""

  architecture = "gpt2"
