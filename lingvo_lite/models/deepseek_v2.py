"""DeepSeek-V2 (V2-Lite's 16B shape by default): multi-head latent attention
(models/latent_attention.py) in pre-RMSNorm blocks with DeepSeek's mixture of experts, as
DeepSeek-V3 (deepseek_v3.py) but for its routing: a softmax over the experts whose top k
weights are used as they are (never renormalized: transformers' DeepseekV2 ignores
`norm_topk_prob`), scaled by `routed_scaling_factor`, chosen from all experts ("greedy") or
from the `topk_group` of `n_group` groups with the best expert ("group_limited_greedy");
no selection bias.

Defaults are DeepSeek-V2-Lite's: 27 layers of width 2048, 16 heads with a full query
projection (no bottleneck), a latent of 512, heads of 128 + 64 rotary features and values of
128, a vocabulary of 102,400, YaRN (factor 40 over 4096 positions, mscale and mscale_all_dim
0.707) to 163,840 positions; one dense layer of 10,944, then 64 routed experts of 1408 (6 per
token) and two shared ones. DeepSeek-V2 (236B) is the same family with a query bottleneck of
1536 and 160 experts in 8 groups.

Hugging Face: `DeepseekV2ForCausalLM` (model_type "deepseek_v2"), rotary features always in
pairs (its complex rotation); `mlp_bias` gives the dense MLPs biases; the experts' tensors
are V3's but for the bias. llama.cpp's `deepseek2` holds it (a softmax gating function).
"""

from __future__ import annotations

from typing import Any

from lingvo_lite.fields import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from lingvo_lite.models import dense_names, expert_dispatch, format_names, latent_names
from lingvo_lite.models import moe_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import Rule
from lingvo_lite.models.deepseek_v3 import (EXPERTS, SOFTMAX_GATING, DeepSeekV3GgufNames,
                                            dense_first, feed_forward)
from lingvo_lite.models.latent_transformer import LatentTransformerLM
from lingvo_lite.models.moe_transformer import MoeTransformerLM
from lingvo_lite.models.transformer import RotaryScaling

# transformers' DeepseekV2 `topk_method`s and the groups each means.
_GREEDY, _GROUPED = "greedy", "group_limited_greedy"


class DeepSeekV2(LatentTransformerLM, MoeTransformerLM):
  """DeepSeek-V2: `LatentTransformerLM`'s and `MoeTransformerLM`'s fields (their docs are
  there and `TransformerLM`'s) with DeepSeek-V2-Lite's sizes and routing as defaults."""

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
  num_experts: PositiveInt = 64
  experts_per_token: PositiveInt = 6
  expert_mlp_dim: PositiveInt | None = 1408
  shared_expert_mlp_dim: NonNegativeInt = 2816
  router_score: expert_dispatch.RouterScore = "softmax"
  renormalize_top_k: bool = False
  first_dense_layers: NonNegativeInt = 1
  load_balance_coefficient: NonNegativeFloat = 0.001

  family_name = "deepseek_v2"
  same_model_as = ()


def _routing(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  """The softmax routing of `topk_method` (the module doc); others are refused."""
  del found
  method = config.expect("topk_method", (_GREEDY, _GROUPED), _GREEDY)
  grouped = {"expert_groups": config.require("n_group"),
             "expert_groups_per_token": config.require("topk_group")} if method == _GROUPED \
      else {"expert_groups": 1, "expert_groups_per_token": None}
  return {"router_score": "softmax", "renormalize_top_k": False, "group_score": "max",
          "selection_bias": False, **grouped}


def _routing_config(model: Any) -> dict[str, Any]:
  if model.expert_groups == 1:
    return {"topk_method": _GREEDY, "n_group": None, "topk_group": None}
  return {"topk_method": _GROUPED, "n_group": model.expert_groups,
          "topk_group": model.expert_groups_per_token or model.expert_groups}


def _routing_from_metadata(metadata: Any, arch: str, tensors: Any, config: dict
                           ) -> dict[str, Any]:
  del tensors, config
  groups = metadata.get(f"{arch}.expert_group_count", 1)
  if groups <= 1:
    return {"topk_method": _GREEDY}
  return {"topk_method": _GROUPED, "n_group": groups,
          "topk_group": metadata.get(f"{arch}.expert_group_used_count")}


ROUTING = Rule("topk_method", _routing, _routing_config, _routing_from_metadata,
               lambda model: {"expert_group_count": model.expert_groups,
                              "expert_group_used_count": model.expert_groups_per_token
                              or model.expert_groups,
                              "expert_gating_func": SOFTMAX_GATING})
# DeepSeek-V2 turns rotary pairs always; transformers' config has no key for it.
_PAIRS = Rule("rotary_style", lambda config, found: {"rotary_style": "interleaved"})


@format_names.names_for(DeepSeekV2)
class DeepSeekV2HfNames(moe_names.MoeHfNames):
  """DeepSeek-V2's Hugging Face names: the latent attention's (latent_names.py), the dense
  layers' SwiGLU (with biases where `mlp_bias`) and the experts' (V3's, no bias)."""

  model_type = "deepseek_v2"
  architecture = "DeepseekV2ForCausalLM"
  config_rows = latent_names.config_rows(
      _PAIRS, dense_first(0), *EXPERTS, ROUTING, max_length=2048,
      num_experts=64, experts_per_token=None, expert_mlp_dim=1407, routed_scaling_factor=1.0)
  tensor_rows = dense_names.tensors(latent_names.layer(feed_forward(dense_names.swiglu())))


@format_names.names_for(DeepSeekV2)
class DeepSeekV2GgufNames(DeepSeekV3GgufNames):
  """llama.cpp's `deepseek2` with softmax gating (V2's): DeepSeek-V3's names otherwise."""

  @classmethod
  def reads_file(cls, metadata: Any) -> bool:
    return not DeepSeekV3GgufNames.reads_file(metadata)
