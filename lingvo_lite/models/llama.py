"""Llama: the shared transformer with Llama's choices as its defaults.

Sequential pre-RMSNorm blocks, a SwiGLU MLP, rotate-half rotary embedding on every dim of each
head, grouped-query attention where `num_kv_heads` is set, and no biases. Experiments give the
sizes: `fdl.Config(Llama, vocab_size=32000, num_layers=32, dim=4096, ...)`.
"""

from __future__ import annotations

from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import layers
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.transformer import PositionKind, TransformerLM


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
  hf_model_type = "llama"
  gguf_architecture = "llama"
  same_model_as = ("lingvo_lite.models.transformer.TransformerLM",)
