"""GPT-J (mesh-transformer-jax): the shared transformer with GPT-J's choices as its defaults.

A parallel block with one LayerNorm, interleaved rotary on part of each head, no attention
biases, a biased MLP with tanh GELU, a biased embedding and an untied, biased output.
Experiments give the sizes: `fdl.Config(GptJ, vocab_size=50400, num_layers=28, dim=4096, ...)`.
"""

from __future__ import annotations

from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import layers
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.transformer import PositionKind, TransformerLM


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
  hf_model_type = "gptj"
  gguf_architecture = "gptj"
  same_model_as = ("lingvo_lite.models.transformer.TransformerLM",)
