"""Qwen3-MoE: Qwen3's attention (a query and key RMSNorm per head, a head width of its own) with
a mixture of experts: 128 SwiGLU experts of their own width, 8 per token (Qwen3-30B-A3B).

Whether the chosen 8 weights are renormalized to sum to 1 is the config's `norm_topk_prob`
(true in the released models, false by default in transformers' config), read as
`renormalize_top_k`. Which layers are MoE is Hugging Face's rule: layer i is sparse unless it
is listed in `mlp_only_layers` or (i + 1) is not a multiple of `decoder_sparse_step`; the other
layers are dense SwiGLU MLPs of `intermediate_size` (our `mlp_dim`), the experts
`moe_intermediate_size` wide (`expert_mlp_dim`). The rule reads as a pattern of feed-forward
kinds (`mlp_kinds`), which scanned layers step over. With `use_sliding_window`, every layer
slides (transformers' Qwen3-MoE has no `max_window_layers`).

Hugging Face (`Qwen3MoeForCausalLM`, model_type "qwen3_moe") stores the router as `mlp.gate` and
each expert's gate_proj (our `wi`), up_proj (`wi_gate`) and down_proj (`wo`) on their own;
llama.cpp's `qwen3moe` stacks them (`ffn_{gate,up,down}_exps`) and has no dense layers and no
setting for the renormalization (it always renormalizes): a model with either is refused as a
GGUF file in one line.
"""

from __future__ import annotations

from typing import Any

from lingvo_lite.errors import UsageError
from lingvo_lite.fields import PositiveFloat, PositiveInt
from lingvo_lite.models import dense_names, format_names, layers, moe_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import FLAG, Key, Rule
from lingvo_lite.models.dense_names import ATTENTION, BLOCK, LAYER, QK_NORMS, norm, swiglu
from lingvo_lite.models.moe_transformer import MoeTransformerLM
from lingvo_lite.models.qwen3 import Qwen3GgufNames
from lingvo_lite.models.tensor_rows import Tensor, where
from lingvo_lite.models.transformer_layers import pattern_of
from lingvo_lite.models.transformer_names import uniform_window


class Qwen3Moe(MoeTransformerLM):
  """Qwen3-MoE: `MoeTransformerLM`'s fields (their docs are there and `TransformerLM`'s) with
  Qwen3-MoE's choices as defaults where they are not `TransformerLM`'s."""

  norm: layers.NormKind = "rmsnorm"
  norm_eps: PositiveFloat = 1e-6
  mlp_activation: layers.Activation = "swiglu"
  rotary_base: PositiveFloat = 1000000.0
  qk_norm: layers.QkNorm = "head"
  num_experts: PositiveInt = 128
  experts_per_token: PositiveInt = 8

  family_name = "qwen3_moe"
  same_model_as = ()


def sparse_layers(config: HfConfig, layers_count: int) -> tuple[str, ...]:
  """Each layer's feed-forward kind by Hugging Face's rule (the module doc)."""
  step = config.get("decoder_sparse_step", 1)
  dense_layers = config.get("mlp_only_layers", [])
  if not isinstance(step, int) or isinstance(step, bool) or step < 1:
    raise config.refuse("decoder_sparse_step", step, "must be a positive integer",
                        "fix the file")
  if not isinstance(dense_layers, list) or not all(
      isinstance(i, int) and not isinstance(i, bool) for i in dense_layers):
    raise config.refuse("mlp_only_layers", dense_layers, "must be a list of layer indices",
                        "fix the file")
  return tuple("moe" if index not in dense_layers and (index + 1) % step == 0 else "dense"
               for index in range(layers_count))


def _sparse_fields(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  return {"mlp_kinds": pattern_of(sparse_layers(config, found["num_layers"]))}


def _sparse_config(model: Any) -> dict[str, Any]:
  kinds = model.mlp_kinds_by_layer()
  return {"decoder_sparse_step": 1,
          "mlp_only_layers": [index for index, kind in enumerate(kinds) if kind == "dense"]}


# Which layers are MoE, by Hugging Face's rule; llama.cpp's qwen3moe has no dense layers.
_SPARSE = Rule("decoder_sparse_step", _sparse_fields, _sparse_config,
               lambda *_: {"decoder_sparse_step": 1, "mlp_only_layers": []})


def _experts(config: HfConfig, key: str, default: int) -> int:
  """`num_experts` (transformers 5 saves it as `num_local_experts`, its attribute map); none
  is refused."""
  experts = config.get(key, config.get("num_local_experts", default))
  if experts == 0:
    raise config.refuse(key, 0, "a Qwen3-MoE without experts is a dense Qwen3",
                        "use its Qwen3 config (model_type 'qwen3')")
  return experts


def _moe_layer(model: Any, layer: int | None) -> bool:
  return model.mlp_kinds_by_layer()[layer] == "moe"


def _dense_layer(model: Any, layer: int | None) -> bool:
  return not _moe_layer(model, layer)


@format_names.names_for(Qwen3Moe)
class Qwen3MoeHfNames(moe_names.MoeHfNames):
  """Qwen3-MoE's Hugging Face names: `intermediate_size` is the dense layers' width,
  `moe_intermediate_size` the experts'; the router `mlp.gate`, each expert's gate_proj (our
  `wi`), up_proj (`wi_gate`) and down_proj (`wo`)."""

  model_type = "qwen3_moe"
  architecture = "Qwen3MoeForCausalLM"
  config_rows = moe_names.CONFIG.changed(
      Key("num_experts", "num_experts", "expert_count", 128, _experts),
      Key("expert_mlp_dim", "moe_intermediate_size", "expert_feed_forward_length", 768,
          source="resolved_expert_mlp_dim"),
      # llama.cpp's qwen3moe renormalizes the chosen experts' weights whatever the file says.
      Key("renormalize_top_k", "norm_topk_prob", lambda *_: True, False, FLAG),
      _SPARSE, uniform_window("use_sliding_window"),
      drop=("num_local_experts", "mlp_bias"),
      experts_per_token=8, rotary_base=1000000.0, max_length=32768)
  tensor_rows = dense_names.tensors(
      norm("attention_norm", "input_layernorm", "attn_norm"), ATTENTION, QK_NORMS,
      norm("mlp_norm", "post_attention_layernorm", "ffn_norm"),
      where(_moe_layer, (Tensor("layer_{i}/mlp/router_kernel", f"{LAYER}mlp.gate.weight",
                                f"{BLOCK}ffn_gate_inp.weight"),) + moe_names.experts(
          f"{LAYER}mlp.experts.{{expert}}.{{projection}}.weight", BLOCK,
          (("gate_proj", "wi", "gate"), ("up_proj", "wi_gate", "up"),
           ("down_proj", "wo", "down")))),
      where(_dense_layer, swiglu(bias=False)))


@format_names.names_for(Qwen3Moe)
class Qwen3MoeGgufNames(Qwen3GgufNames):
  """llama.cpp's `qwen3moe`: Qwen3's names (the query and key norms, rows as they are), each
  layer's feed-forward the router and the stacked experts."""

  architecture = "qwen3moe"

  @classmethod
  def reads_file(cls, metadata: Any) -> bool:
    del metadata
    return True

  def check_writable(self) -> None:
    model = self.model
    if "dense" in model.mlp_kinds_by_layer():
      raise UsageError("model: a qwen3_moe model with dense layers (Hugging Face's "
                       "mlp_only_layers): llama.cpp's qwen3moe makes every layer a mixture "
                       "of experts; export --export_format=hf")
    if not model.renormalize_top_k:
      raise UsageError("model.renormalize_top_k=False (Hugging Face's norm_topk_prob): "
                       "llama.cpp's qwen3moe always renormalizes the chosen experts' weights; "
                       "export --export_format=hf")
    super().check_writable()
