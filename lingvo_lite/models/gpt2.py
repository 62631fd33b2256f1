"""GPT-2: the shared transformer with GPT-2's choices as its defaults.

Sequential pre-LayerNorm blocks, learned absolute positions (`max_length` rows), tanh GELU,
biases everywhere, and the output projection tied to the token embedding. Experiments give
the sizes: `fdl.Config(Gpt2, vocab_size=50304, num_layers=12, dim=768, ...)`.
"""

from __future__ import annotations

from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import layers
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.transformer import PositionKind, TransformerLM


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
  hf_model_type = "gpt2"
  gguf_architecture = "gpt2"
  same_model_as = ("lingvo_lite.models.transformer.TransformerLM",)
