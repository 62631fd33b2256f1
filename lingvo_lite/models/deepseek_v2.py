"""DeepSeek-V2 (V2-Lite's 16B shape by default): multi-head latent attention
(models/latent_attention.py) in pre-RMSNorm blocks with SwiGLU feed-forward layers, as
DeepSeek-V3 (deepseek_v3.py) but for its routing (a softmax over the experts, V2's) and its
configs.

Defaults are DeepSeek-V2-Lite's: 27 layers of width 2048, 16 heads with a full query
projection (no bottleneck), a latent of 512, heads of 128 + 64 rotary features and values of
128, a vocabulary of 102,400, YaRN (factor 40 over 4096 positions, mscale and mscale_all_dim
0.707) to 163,840 positions. DeepSeek-V2 (236B) is the same family with a query bottleneck
of 1536.

Hugging Face: `DeepseekV2ForCausalLM` (model_type "deepseek_v2"), rotary features always in
pairs (its complex rotation); `mlp_bias` gives the dense MLPs biases. The first
`first_k_dense_replace` layers are dense, the rest experts: refused in one line until the
mixture is built here (as deepseek_v3.py). llama.cpp's `deepseek2` holds it (a softmax
gating function).
"""

from __future__ import annotations

from typing import Any

from lingvo_lite.fields import NonNegativeFloat, PositiveFloat, PositiveInt
from lingvo_lite.models import dense_names, format_names, latent_names
from lingvo_lite.models.config_rows import Rule
from lingvo_lite.models.deepseek_v3 import SOFTMAX_GATING, DeepSeekV3GgufNames, dense_layers
from lingvo_lite.models.latent_transformer import LatentTransformerLM
from lingvo_lite.models.transformer import RotaryScaling
from lingvo_lite.models.transformer_names import TransformerHfNames


class DeepSeekV2(LatentTransformerLM):
  """DeepSeek-V2: `LatentTransformerLM`'s fields (their docs are there and `TransformerLM`'s)
  with DeepSeek-V2-Lite's sizes as defaults."""

  vocab_size: PositiveInt = 102400
  num_layers: PositiveInt = 27
  dim: PositiveInt = 2048
  num_heads: PositiveInt = 16
  mlp_dim: PositiveInt | None = 10944
  q_lora_rank: PositiveInt | None = None
  max_length: PositiveInt = 163840
  rotary_scaling: RotaryScaling = "yarn"
  rotary_scaling_factor: PositiveFloat = 40.0
  rotary_original_max_length: PositiveInt = 4096
  rotary_attention_factor: PositiveFloat | None = 1.0
  rotary_mscale_all_dim: NonNegativeFloat = 0.707

  family_name = "deepseek_v2"
  same_model_as = ()


# DeepSeek-V2 turns rotary pairs always; transformers' config has no key for it.
_PAIRS = Rule("rotary_style", lambda config, found: {"rotary_style": "interleaved"})


@format_names.names_for(DeepSeekV2)
class DeepSeekV2HfNames(TransformerHfNames):
  """DeepSeek-V2's Hugging Face names: the latent attention's (latent_names.py), each layer's
  dense SwiGLU MLP (with biases where `mlp_bias`)."""

  model_type = "deepseek_v2"
  architecture = "DeepseekV2ForCausalLM"
  config_rows = latent_names.config_rows(
      _PAIRS, dense_layers(0), Rule("expert_gating_func", metadata=lambda model: {
          "expert_gating_func": SOFTMAX_GATING}), q_lora_rank=None, max_length=2048)
  tensor_rows = dense_names.tensors(latent_names.layer(dense_names.swiglu()))


@format_names.names_for(DeepSeekV2)
class DeepSeekV2GgufNames(DeepSeekV3GgufNames):
  """llama.cpp's `deepseek2` with softmax gating (V2's): DeepSeek-V3's names otherwise."""

  @classmethod
  def reads_file(cls, metadata: Any) -> bool:
    return not DeepSeekV3GgufNames.reads_file(metadata)
