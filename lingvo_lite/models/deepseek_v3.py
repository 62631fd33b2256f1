"""DeepSeek-V3 (and R1, Kimi K2: the same architecture at other sizes): multi-head latent
attention (models/latent_attention.py) in pre-RMSNorm blocks with SwiGLU feed-forward layers.

Defaults are DeepSeek-V3's 671B shape: 61 layers of width 7168, 128 heads, a query bottleneck
of 1536, a latent of 512, heads of 128 + 64 rotary features and values of 128, a vocabulary
of 129,280, YaRN (factor 40 over 4096 positions, mscale and mscale_all_dim 1) to 163,840
positions.

Hugging Face: `DeepseekV3ForCausalLM` (model_type "deepseek_v3") is read and written;
`rope_interleave` (true in the released configs) says the rotary features turn in pairs
(false: in halves). The first `first_k_dense_replace` layers have a dense MLP of
`intermediate_size`, the rest DeepSeek's mixture of experts; until that mixture is built
here, a config with expert layers is refused in one line, and export writes a dense model
(first_k_dense_replace = the layers). llama.cpp's GGUF architecture `deepseek2` holds the same
tensors (latent_names.py).
"""

from __future__ import annotations

from typing import Any

from lingvo_lite.errors import UsageError
from lingvo_lite.fields import NonNegativeFloat, PositiveFloat, PositiveInt
from lingvo_lite.models import dense_names, format_names, latent_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import Rule
from lingvo_lite.models.latent_transformer import LatentTransformerLM
from lingvo_lite.models.transformer import RotaryScaling
from lingvo_lite.models.transformer_names import TransformerGgufNames, TransformerHfNames


class DeepSeekV3(LatentTransformerLM):
  """DeepSeek-V3: `LatentTransformerLM`'s fields (their docs are there and `TransformerLM`'s)
  with DeepSeek-V3's sizes as defaults."""

  vocab_size: PositiveInt = 129280
  num_layers: PositiveInt = 61
  dim: PositiveInt = 7168
  num_heads: PositiveInt = 128
  mlp_dim: PositiveInt | None = 18432
  max_length: PositiveInt = 163840
  rotary_scaling: RotaryScaling = "yarn"
  rotary_scaling_factor: PositiveFloat = 40.0
  rotary_original_max_length: PositiveInt = 4096
  rotary_attention_factor: PositiveFloat | None = 1.0
  rotary_mscale_all_dim: NonNegativeFloat = 1.0

  family_name = "deepseek_v3"
  same_model_as = ()


def dense_layers(first_dense_default: int) -> Rule:
  """Every layer dense: `first_k_dense_replace` (transformers' default for the family
  `first_dense_default`) at least the layers, or no routed experts; a config with expert
  layers is refused (the module doc). Export says every layer is dense."""

  def fields(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
    first_dense = config.get("first_k_dense_replace", first_dense_default)
    experts = config.get("n_routed_experts", 1)
    if experts and first_dense < found["num_layers"]:
      raise config.refuse("first_k_dense_replace", first_dense,
                          f"layers {first_dense} to {found['num_layers'] - 1} are DeepSeek's "
                          "mixture of experts, which lingvo_lite does not read yet",
                          "use a config whose first_k_dense_replace is num_hidden_layers "
                          f"({found['num_layers']})")
    return {}

  def from_metadata(metadata: Any, arch: str, tensors: Any, config: dict) -> dict[str, Any]:
    del tensors, config
    return {"first_k_dense_replace": metadata.get(f"{arch}.leading_dense_block_count"),
            "n_routed_experts": metadata.get(f"{arch}.expert_count", 0)}

  return Rule("first_k_dense_replace", fields,
              lambda model: {"first_k_dense_replace": model.num_layers}, from_metadata,
              lambda model: {"leading_dense_block_count": model.num_layers})


def _rotary_style(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  del found
  return {"rotary_style": "interleaved" if config.flag("rope_interleave", True) else "half"}


INTERLEAVE = Rule("rope_interleave", _rotary_style,
                  lambda model: {"rope_interleave": model.rotary_style == "interleaved"})


# llama.cpp's gating function of the experts (its LLAMA_EXPERT_GATING_FUNC_TYPE_*): V3's
# sigmoid, which tells a V3 file from a V2 one (softmax) of the one deepseek2 architecture.
SOFTMAX_GATING, SIGMOID_GATING = 1, 2
GATING = Rule("expert_gating_func", metadata=lambda model: {
    "expert_gating_func": SIGMOID_GATING})


@format_names.names_for(DeepSeekV3)
class DeepSeekV3HfNames(TransformerHfNames):
  """DeepSeek-V3's Hugging Face names: the latent attention's (latent_names.py), each
  layer's dense SwiGLU MLP (no biases)."""

  model_type = "deepseek_v3"
  architecture = "DeepseekV3ForCausalLM"
  config_rows = latent_names.config_rows(
      INTERLEAVE, dense_layers(3), GATING, drop=("mlp_bias",), q_lora_rank=1536, max_length=4096)
  tensor_rows = dense_names.tensors(latent_names.layer(dense_names.swiglu(bias=False)))


@format_names.names_for(DeepSeekV3)
class DeepSeekV3GgufNames(TransformerGgufNames):
  """llama.cpp's `deepseek2`: the tensors as they are (its rope turns adjacent pairs, as
  DeepSeek's), no attention biases, the rotary features in pairs."""

  architecture = "deepseek2"
  defaults = {"rope_interleave": True}

  @classmethod
  def reads_file(cls, metadata: Any) -> bool:
    """A deepseek2 file whose experts are gated by a sigmoid (V3's; V2's by a softmax)."""
    return metadata.get(f"{cls.architecture}.expert_gating_func") == SIGMOID_GATING

  def check_writable(self) -> None:
    model = self.model
    problem = None
    if model.attention_bias:
      problem = "attention biases (Hugging Face's attention_bias)"
    elif model.rotary_style != "interleaved":
      problem = "rotary features in halves (Hugging Face's rope_interleave=false)"
    elif model.rotary_scaling not in ("none", "yarn"):
      problem = f"rope scaling {model.rotary_scaling!r}"
    elif model.rotary_scaling == "yarn" and (
        model.rotary_scaling_settings()[3:] != (32.0, 1.0, 1.0, True)):
      # llama.cpp's deepseek2 scales sin and cos by 1 (its YaRN magnitude cancels its
      # attn_factor), i.e. Hugging Face's mscale equal to mscale_all_dim, with YaRN's slopes.
      problem = ("YaRN other than llama.cpp's (attention factor 1: mscale equal to "
                 "mscale_all_dim; slopes 32 and 1; a truncated correction range)")
    if problem:
      raise UsageError(f"model: {problem}: a GGUF {self.architecture} model cannot express "
                       "it; export --export_format=hf")
    super().check_writable()
