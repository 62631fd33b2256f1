"""Latent attention's names in other formats (models/latent_attention.py), as transformers'
`deepseek_v2` / `deepseek_v3` and llama.cpp's `deepseek2` name them: the config rows its sizes
and rotary settings read from and the tensor rows of one layer's attention, which the
DeepSeek families (deepseek_v3.py, deepseek_v2.py) put in their tables.

Hugging Face: `self_attn.q_proj` (no bottleneck) or `q_a_proj`, `q_a_layernorm`, `q_b_proj`;
`kv_a_proj_with_mqa` (the latent then the rotary key), `kv_a_layernorm`, `kv_b_proj` (each
head's k_nope then v rows), `o_proj`; the down projections and the output have biases with
`attention_bias`. llama.cpp (gguf 0.19's tensor names): attn_q or attn_q_a, attn_q_a_norm,
attn_q_b; attn_kv_a_mqa, attn_kv_a_norm, attn_kv_b, attn_output. Newer llama.cpp converters
also split attn_kv_b into attn_k_b and attn_v_b (and its loader asks for them); gguf 0.19
names both forms, and these tables write and read attn_kv_b.

YaRN in a DeepSeek config carries `mscale` and `mscale_all_dim` (DeepSeek-V3: both 1.0):
transformers scales the rotary sin and cos by mscale(factor, mscale) / mscale(factor,
mscale_all_dim) (our `rotary_attention_factor`, when the config gives no attention_factor)
and every score by mscale(factor, mscale_all_dim)^2 (`rotary_mscale_all_dim`).
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.models import dense_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import Key, Rows, Rule
from lingvo_lite.models.dense_names import BLOCK, LAYER
from lingvo_lite.models.latent_attention import yarn_mscale
from lingvo_lite.models.rope_names import rope_scaling, rotary_scaling_fields
from lingvo_lite.models.tensor_rows import Tensor, vector

ATTENTION_HF, ATTENTION_GGUF = f"{LAYER}self_attn.", f"{BLOCK}attn_"
OURS = "layer_{i}/attention/"


def _bottleneck(model: Any, layer: int | None) -> bool:
  del layer
  return model.q_lora_rank is not None


def _full_query(model: Any, layer: int | None) -> bool:
  return not _bottleneck(model, layer)


def _biased(model: Any, layer: int | None) -> bool:
  del layer
  return model.attention_bias


def _matrix(ours: str, hf: str, gguf: str, when: Any = None, input_axes: int = 1
            ) -> Tensor:
  return Tensor(f"{OURS}{ours}", f"{ATTENTION_HF}{hf}.weight", f"{ATTENTION_GGUF}{gguf}.weight",
                input_axes, when=when)


def _bias(ours: str, hf: str, when: Any) -> Tensor:
  return vector(f"{OURS}{ours}", f"{ATTENTION_HF}{hf}.bias", None, when=when)


def _norm(ours: str, hf: str, gguf: str, when: Any = None) -> Tensor:
  return vector(f"{OURS}{ours}/scale", f"{ATTENTION_HF}{hf}.weight",
                f"{ATTENTION_GGUF}{gguf}.weight", norm=True, when=when)


def _with_bottleneck(model: Any, layer: int | None) -> bool:
  return _bottleneck(model, layer) and model.attention_bias


# One layer's attention, in the order transformers registers its parameters.
ATTENTION = (
    _matrix("query_kernel", "q_proj", "q", _full_query),
    _matrix("query_a/kernel", "q_a_proj", "q_a", _bottleneck),
    _bias("query_a/bias", "q_a_proj", _with_bottleneck),
    _norm("query_a_norm", "q_a_layernorm", "q_a_norm", _bottleneck),
    _matrix("query_b_kernel", "q_b_proj", "q_b", _bottleneck),
    _matrix("kv_a/kernel", "kv_a_proj_with_mqa", "kv_a_mqa"),
    _bias("kv_a/bias", "kv_a_proj_with_mqa", _biased),
    _norm("kv_a_norm", "kv_a_layernorm", "kv_a_norm"),
    _matrix("kv_b_kernel", "kv_b_proj", "kv_b"),
    _matrix("out_kernel", "o_proj", "output", input_axes=2),
    _bias("out_bias", "o_proj", _biased),
)


def layer(mlp: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
  """A layer's rows: the latent attention, `mlp`, then its norms (transformers' order)."""
  return (*ATTENTION, *mlp, *dense_names.norm("attention_norm", "input_layernorm", "attn_norm"),
          *dense_names.norm("mlp_norm", "post_attention_layernorm", "ffn_norm"))


# ------------------------------------------------------------------------------ config


def _heads_share_nothing(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  """`num_key_value_heads`: every head has its own key and value (transformers fills in the
  heads' count); another count is refused."""
  kv_heads = config.get("num_key_value_heads")
  if kv_heads is not None and kv_heads != found["num_heads"]:
    raise config.refuse("num_key_value_heads", kv_heads, "latent attention gives every head "
                        "its own key and value", f"use {found['num_heads']} (the heads)")
  return {}


KV_HEADS = Rule("num_key_value_heads", _heads_share_nothing,
                lambda model: {"num_key_value_heads": model.num_heads},
                lambda *_: {}, lambda model: {"attention.head_count_kv": model.num_heads})


def _rope_fields(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  """The rotary scaling with DeepSeek's YaRN magnitudes (the module doc)."""
  scaling = config.rope_scaling()
  if scaling is None:
    return {"rotary_scaling": "none"}
  settings = HfConfig(scaling, config.where)
  mscale, all_dim = settings.number("mscale"), settings.number("mscale_all_dim")
  rest = {k: v for k, v in scaling.items() if k not in ("mscale", "mscale_all_dim")}
  fields = rotary_scaling_fields(config, rest, "rope_scaling", max_length=found["max_length"])
  if all_dim:
    fields["rotary_mscale_all_dim"] = all_dim
  factor = fields.get("rotary_scaling_factor", 1.0)
  if (fields.get("rotary_scaling") == "yarn" and fields.get("rotary_attention_factor") is None
      and mscale and all_dim):
    fields["rotary_attention_factor"] = yarn_mscale(factor, mscale) / yarn_mscale(factor,
                                                                                  all_dim)
  return fields


def _rope_config(model: Any) -> dict[str, Any]:
  scaling = rope_scaling(model.rotary_scaling_settings("full")) or {"rope_type": "default"}
  if model.rotary_scaling != "none" and model.rotary_mscale_all_dim:
    scaling["mscale_all_dim"] = model.rotary_mscale_all_dim
  return {"rope_parameters": {**scaling, "rope_theta": model.rotary_base}}


def _rope_from_metadata(metadata: Mapping[str, Any], arch: str, tensors: Any, config: dict
                        ) -> dict[str, Any]:
  """llama.cpp's YaRN keys: its factor, original context and log multiplier (0.1 x
  mscale_all_dim)."""
  del tensors, config
  if metadata.get(f"{arch}.rope.scaling.type") != "yarn":
    return {}
  log_multiplier = metadata.get(f"{arch}.rope.scaling.yarn_log_multiplier", 0.0)
  return {"rope_parameters": {
      "rope_type": "yarn", "rope_theta": metadata.get(f"{arch}.rope.freq_base", 10000.0),
      "factor": metadata.get(f"{arch}.rope.scaling.factor", 1.0),
      "original_max_position_embeddings": metadata.get(
          f"{arch}.rope.scaling.original_context_length", 4096),
      "mscale": log_multiplier / 0.1, "mscale_all_dim": log_multiplier / 0.1}}


def _rope_metadata(model: Any) -> dict[str, Any]:
  if model.rotary_scaling == "none":
    return {}
  return {"rope.scaling.type": model.rotary_scaling,
          "rope.scaling.factor": float(model.rotary_scaling_factor),
          "rope.scaling.original_context_length": model.rotary_original_max_length,
          "rope.scaling.yarn_log_multiplier": 0.1 * model.rotary_mscale_all_dim}


ROPE = Rule("rope_scaling", _rope_fields, _rope_config, _rope_from_metadata, _rope_metadata)


def _mla_key_length(metadata: Mapping[str, Any], arch: str, tensors: Any, config: dict) -> Any:
  """qk_nope from llama.cpp's key width with MLA less the rotary width."""
  del tensors
  length = metadata.get(f"{arch}.attention.key_length_mla")
  rope = config.get("qk_rope_head_dim", metadata.get(f"{arch}.rope.dimension_count"))
  return None if length is None or rope is None else length - rope


# The latent attention's sizes: config.json's keys, llama.cpp's (its key and value widths
# are the "MQA" latent form, kv_lora_rank + qk_rope and kv_lora_rank; with MLA, per head).
SIZES = (
    Key("q_lora_rank", "q_lora_rank", "attention.q_lora_rank", None),
    Key("kv_lora_rank", "kv_lora_rank", "attention.kv_lora_rank", 512),
    Key("qk_rope_head_dim", "qk_rope_head_dim", "rope.dimension_count", 64),
    Key("qk_nope_head_dim", "qk_nope_head_dim", _mla_key_length, 128),
    Key("v_head_dim", "v_head_dim", "attention.value_length_mla", 128),
    Rule("attention.key_length", metadata=lambda model: {
        "attention.key_length": model.kv_lora_rank + model.qk_rope_head_dim,
        "attention.value_length": model.kv_lora_rank,
        "attention.key_length_mla": model.resolved_head_dim}),
    KV_HEADS,
)
# What the dense table says that latent attention derives or says otherwise.
DROPPED = ("head_dim", "attention.value_length", "rope.dimension_count",
           "num_key_value_heads", "rope_scaling")


def config_rows(*rows: Any, **defaults: Any) -> Rows:
  """The dense transformer's rows with latent attention's sizes and rotary settings, then
  `rows` (a family's), each field of `defaults` read with that default."""
  return dense_names.CONFIG.changed(drop=DROPPED).changed(*SIZES, ROPE, *rows, **defaults)
