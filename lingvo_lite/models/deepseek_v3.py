"""DeepSeek-V3 (and R1, Kimi K2: the same architecture at other sizes): multi-head latent
attention (models/latent_attention.py) in pre-RMSNorm blocks, the first layers' feed-forward
a dense SwiGLU MLP, the others DeepSeek's mixture of experts (models/moe.py with its groups,
shared experts and selection bias: models/moe_transformer.py).

Defaults are DeepSeek-V3's 671B shape: 61 layers of width 7168, 128 heads, a query bottleneck
of 1536, a latent of 512, heads of 128 + 64 rotary features and values of 128, a vocabulary
of 129,280, YaRN (factor 40 over 4096 positions, mscale and mscale_all_dim 1) to 163,840
positions; 3 dense layers of 18,432, then 256 routed experts of 2048 (8 per token, from 4 of
8 groups scored by their two best biased sigmoid scores, weights renormalized and scaled by
2.5) and one shared expert, balanced by the selection bias (the auxiliary-loss-free rule).

Hugging Face: `DeepseekV3ForCausalLM` (model_type "deepseek_v3") is read and written;
`rope_interleave` (true in the released configs) says the rotary features turn in pairs
(false: in halves); the router is `mlp.gate` with its `e_score_correction_bias` (our
selection bias), each routed expert's gate_proj (our `wi`), up_proj (`wi_gate`) and
down_proj (`wo`) on their own, the shared experts as one MLP (`mlp.shared_experts`,
n_shared_experts x moe_intermediate_size wide). The multi-token prediction layer of a
released checkpoint (`num_nextn_predict_layers`) is left unread, as transformers leaves it.
llama.cpp's `deepseek2` holds the same tensors (experts stacked, the bias as exp_probs_b),
its gating function sigmoid.
"""

from __future__ import annotations

from typing import Any

from lingvo_lite.errors import UsageError
from lingvo_lite.fields import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from lingvo_lite.models import dense_names, expert_dispatch, format_names, latent_names
from lingvo_lite.models import moe_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import FLAG, NUMBER, Fixed, Key, Rule
from lingvo_lite.models.dense_names import BLOCK, LAYER
from lingvo_lite.models.latent_transformer import LatentTransformerLM
from lingvo_lite.models.moe_transformer import MoeTransformerLM
from lingvo_lite.models.tensor_rows import Tensor, vector, where
from lingvo_lite.models.transformer import RotaryScaling
from lingvo_lite.models.transformer_names import TransformerGgufNames


class DeepSeekV3(LatentTransformerLM, MoeTransformerLM):
  """DeepSeek-V3: `LatentTransformerLM`'s and `MoeTransformerLM`'s fields (their docs are
  there and `TransformerLM`'s) with DeepSeek-V3's sizes and routing as defaults."""

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
  num_experts: PositiveInt = 256
  experts_per_token: PositiveInt = 8
  expert_mlp_dim: PositiveInt | None = 2048
  shared_expert_mlp_dim: NonNegativeInt = 2048
  router_score: expert_dispatch.RouterScore = "sigmoid"
  renormalize_top_k: bool = True
  expert_groups: PositiveInt = 8
  expert_groups_per_token: PositiveInt | None = 4
  group_score: expert_dispatch.GroupScore = "top2_sum"
  routed_scaling_factor: PositiveFloat = 2.5
  selection_bias: bool = True
  first_dense_layers: NonNegativeInt = 3
  # DeepSeek-V3's complementary sequence-wise balance loss is 1e-4; the bias does the rest.
  load_balance_coefficient: NonNegativeFloat = 0.0001

  family_name = "deepseek_v3"
  same_model_as = ()


# ------------------------------------------------------------------------------ tensors


def _moe_layer(model: Any, layer: int | None) -> bool:
  return model.mlp_kinds_by_layer()[layer] == "moe"


def _dense_layer(model: Any, layer: int | None) -> bool:
  return not _moe_layer(model, layer)


def _biased_choice(model: Any, layer: int | None) -> bool:
  return model.selection_bias and _moe_layer(model, layer)


def feed_forward(dense: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
  """A layer's feed-forward rows: `dense` (a dense layer's SwiGLU) or the mixture's router,
  its selection bias (V3's), the routed experts and the shared experts."""
  shared = tuple(Tensor(f"layer_{{i}}/mlp/shared/{ours}/kernel",
                        f"{LAYER}mlp.shared_experts.{theirs}_proj.weight",
                        f"{BLOCK}ffn_{theirs}_shexp.weight")
                 for ours, theirs in (("wi", "gate"), ("wi_gate", "up"), ("wo", "down")))
  routed = moe_names.experts(f"{LAYER}mlp.experts.{{expert}}.{{projection}}.weight", BLOCK,
                             (("gate_proj", "wi", "gate"), ("up_proj", "wi_gate", "up"),
                              ("down_proj", "wo", "down")))
  return (*where(_dense_layer, dense),
          *where(_moe_layer, (Tensor("layer_{i}/mlp/router_kernel", f"{LAYER}mlp.gate.weight",
                                     f"{BLOCK}ffn_gate_inp.weight"),)),
          vector("layer_{i}/mlp/selection_bias", f"{LAYER}mlp.gate.e_score_correction_bias",
                 f"{BLOCK}exp_probs_b.bias", when=_biased_choice),
          *where(_moe_layer, routed + shared))


# ------------------------------------------------------------------------------ config


def _shared_fields(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  return {"shared_expert_mlp_dim": config.get("n_shared_experts", 1)
          * found["expert_mlp_dim"]}


def _shared_config(model: Any) -> dict[str, Any]:
  """n_shared_experts; a width no whole count of experts makes reads back otherwise, which
  export refuses by comparing what the config says."""
  return {"n_shared_experts": model.shared_expert_mlp_dim // model.resolved_expert_mlp_dim}


SHARED = Rule("n_shared_experts", _shared_fields, _shared_config,
              lambda metadata, arch, tensors, config: {
                  "n_shared_experts": metadata.get(f"{arch}.expert_shared_count")},
              lambda model: {"expert_shared_count": _shared_config(model)["n_shared_experts"]})


def _dense_first(config: HfConfig, found: dict[str, Any], default: int) -> dict[str, Any]:
  first = config.get("first_k_dense_replace", default)
  if not isinstance(first, int) or isinstance(first, bool) or first < 0:
    raise config.refuse("first_k_dense_replace", first, "must be a whole number of layers",
                        "fix the file")
  return {"first_dense_layers": first, "mlp_kinds": ("moe",)}


def dense_first(default: int) -> Rule:
  """`first_k_dense_replace` (transformers' default for the family: `default`): the first
  layers are dense, the others experts."""
  return Rule("first_k_dense_replace",
              lambda config, found: _dense_first(config, found, default),
              lambda model: {"first_k_dense_replace": min(model.first_dense_layers,
                                                          model.num_layers)},
              lambda metadata, arch, tensors, config: {
                  "first_k_dense_replace": metadata.get(f"{arch}.leading_dense_block_count")},
              lambda model: {"leading_dense_block_count": min(model.first_dense_layers,
                                                              model.num_layers)})


# The experts' settings both DeepSeek families name alike (config.json, llama.cpp's keys).
EXPERTS = (
    Key("num_experts", "n_routed_experts", "expert_count", 256),
    Key("experts_per_token", "num_experts_per_tok", "expert_used_count", 8),
    Key("expert_mlp_dim", "moe_intermediate_size", "expert_feed_forward_length", 2048,
        source="resolved_expert_mlp_dim"),
    SHARED,
    Key("routed_scaling_factor", "routed_scaling_factor", "expert_weights_scale", 2.5, NUMBER),
    Fixed("output_router_logits", False, checked=False),
)
# llama.cpp's gating function of the experts (its LLAMA_EXPERT_GATING_FUNC_TYPE_*): V3's
# sigmoid tells a V3 file from a V2 one (softmax) of the one deepseek2 architecture.
SOFTMAX_GATING, SIGMOID_GATING = 1, 2


def _groups(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  del found
  groups = config.get("n_group", 8)
  return {"expert_groups": groups, "expert_groups_per_token": config.get("topk_group", 4)}


GROUPS = Rule("n_group", _groups,
              lambda model: {"n_group": model.expert_groups,
                             "topk_group": model.expert_groups_per_token or model.expert_groups},
              lambda metadata, arch, tensors, config: {
                  "n_group": metadata.get(f"{arch}.expert_group_count"),
                  "topk_group": metadata.get(f"{arch}.expert_group_used_count")},
              lambda model: {"expert_group_count": model.expert_groups,
                             "expert_group_used_count": model.expert_groups_per_token
                             or model.expert_groups,
                             "expert_gating_func": SIGMOID_GATING})
# V3's routing: sigmoid scores chosen with their bias, groups by their two best.
ROUTING = Rule("scoring_func", lambda config, found: {
    "router_score": "sigmoid", "group_score": "top2_sum", "selection_bias": True})


def _rotary_style(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  del found
  return {"rotary_style": "interleaved" if config.flag("rope_interleave", True) else "half"}


INTERLEAVE = Rule("rope_interleave", _rotary_style,
                  lambda model: {"rope_interleave": model.rotary_style == "interleaved"})


@format_names.names_for(DeepSeekV3)
class DeepSeekV3HfNames(moe_names.MoeHfNames):
  """DeepSeek-V3's Hugging Face names (the module doc): the latent attention's
  (latent_names.py), the dense layers' SwiGLU and the experts'."""

  model_type = "deepseek_v3"
  architecture = "DeepseekV3ForCausalLM"
  config_rows = latent_names.config_rows(
      INTERLEAVE, dense_first(3), *EXPERTS, GROUPS, ROUTING,
      Key("renormalize_top_k", "norm_topk_prob", "expert_weights_norm", True, FLAG),
      drop=("mlp_bias",), q_lora_rank=1536, max_length=4096)
  tensor_rows = dense_names.tensors(latent_names.layer(feed_forward(
      dense_names.swiglu(bias=False))))


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

  @classmethod
  def hf_config(cls, metadata: Any, tensors: Any) -> dict[str, Any]:
    """Refuses a file of newer llama.cpp converters, which split attn_kv_b into attn_k_b and
    attn_v_b and leave attn_kv_b out (latent_names.py)."""
    if "blk.0.attn_kv_b.weight" not in tensors and "blk.0.attn_k_b.weight" in tensors:
      raise UsageError(f"{cls.architecture}: the file holds the latent's up projection as "
                       "attn_k_b and attn_v_b (newer llama.cpp converters), which lingvo_lite "
                       "does not read; read the model's Hugging Face folder (hf:PATH)")
    return super().hf_config(metadata, tensors)

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
