"""Model configs of the three transformer families; experiments pick one and set sizes.

Each function returns `fdl.Config(TransformerLM)` with the family's structural choices and
takes the sizes (and any other field) as keyword arguments.
"""

import fiddle as fdl

from lingvo_lite.models.transformer import TransformerLM


def gptj(**fields) -> fdl.Config[TransformerLM]:
  """GPT-J (mesh-transformer-jax): parallel block with one LayerNorm, interleaved rotary on
  part of each head, no attention biases, biased MLP with tanh GELU, biased embedding and
  untied biased output."""
  return fdl.Config(TransformerLM, **{
      "block": "parallel", "norm": "layernorm", "norm_eps": 1e-5,
      "mlp_activation": "gelu_tanh", "position": "rotary", "rotary_style": "interleaved",
      "attention_bias": False, "mlp_bias": True, "embedding_bias": True,
      "tie_embeddings": False, "output_bias": True, **fields})


def llama(**fields) -> fdl.Config[TransformerLM]:
  """Llama: sequential pre-RMSNorm blocks, SwiGLU, rotate-half RoPE, no biases."""
  return fdl.Config(TransformerLM, **{
      "block": "sequential", "norm": "rmsnorm", "norm_eps": 1e-5, "mlp_activation": "swiglu",
      "position": "rotary", "rotary_style": "half", "attention_bias": False,
      "mlp_bias": False, "embedding_bias": False, "tie_embeddings": False,
      "output_bias": False, **fields})


def gpt2(**fields) -> fdl.Config[TransformerLM]:
  """GPT-2: sequential pre-LayerNorm blocks, learned positions, GELU, biases everywhere,
  output tied to the token embedding."""
  return fdl.Config(TransformerLM, **{
      "block": "sequential", "norm": "layernorm", "norm_eps": 1e-5,
      "mlp_activation": "gelu_tanh", "position": "learned", "attention_bias": True,
      "mlp_bias": True, "embedding_bias": False, "tie_embeddings": True,
      "output_bias": False, **fields})
