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

from typing import Any

from lingvo_lite.models import format_names, gpt2, layers
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.config_rows import Fixed, Key
from lingvo_lite.models.tensor_rows import attention, dense, norm
from lingvo_lite.models.transformer import TransformerLM
from lingvo_lite.models.transformer_names import TransformerGgufNames, TransformerHfNames


class GptJ(TransformerLM):
  """GPT-J: `TransformerLM`'s fields (their docs are there), with GPT-J's choices as defaults
  where they are not `TransformerLM`'s (LayerNorm, tanh GELU, no attention biases, an untied
  output)."""

  block: BlockKind = "parallel"
  rotary_style: layers.RotaryStyle = "interleaved"
  mlp_bias: bool = True
  embedding_bias: bool = True
  output_bias: bool = True

  family_name = "gptj"
  same_model_as = ("lingvo_lite.models.transformer.TransformerLM",)


@format_names.names_for(GptJ)
class GptJHfNames(TransformerHfNames):
  """GPT-J's Hugging Face names: GPT-2's keys, its rotary width, an untied output."""

  model_type = "gptj"
  architecture = "GPTJForCausalLM"
  config_rows = gpt2.CONFIG.changed(
      Fixed("tie_word_embeddings", False),
      Key("rotary_dim", "rotary_dim", "rope.dimension_count", None,
          source="resolved_rotary_dim"),
      max_length=2048)
  tensor_rows = (
      gpt2.TOKENS,
      *norm("layer_{i}/norm", f"{gpt2.LAYER}ln_1", "blk.{i}.attn_norm", bias=True),
      *attention(f"{gpt2.LAYER}attn.", ("q_proj", "k_proj", "v_proj", "out_proj"), "blk.{i}."),
      *dense("layer_{i}/mlp/wi", f"{gpt2.LAYER}mlp.fc_in", "blk.{i}.ffn_up", True, gguf_bias=True),
      *dense("layer_{i}/mlp/wo", f"{gpt2.LAYER}mlp.fc_out", "blk.{i}.ffn_down", True,
             gguf_bias=True),
      *gpt2.FINAL_NORM,
      *dense("output", "lm_head", "output", bias=True, gguf_bias=True))

  def export_params(self, params: dict[str, Any]) -> dict[str, Any]:
    """The embedding bias folded into the rows (E[t] + b = (E + b)[t]), as
    mesh-transformer-jax's conversion does: the format has no tensor for it."""
    bias = params["embedding_bias"]
    return dict(params, embedding=params["embedding"] + bias[None, :],
                embedding_bias=bias * 0)

  def absent(self) -> tuple[str, ...]:
    return ("embedding_bias",)


@format_names.names_for(GptJ)
class GptJGgufNames(TransformerGgufNames):
  """llama.cpp's `gptj`: the Hugging Face tensors in the same layout."""

  architecture = "gptj"
