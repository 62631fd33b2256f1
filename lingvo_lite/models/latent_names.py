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
names both forms, and these tables write and read attn_kv_b. llama.cpp's metadata holds the
sizes (`attention.q_lora_rank`, `attention.kv_lora_rank`, `rope.dimension_count`, the heads'
widths with MLA `attention.key_length_mla` / `value_length_mla`, and its "MQA" form's
`attention.key_length` = kv_lora_rank + qk_rope, `value_length` = kv_lora_rank); a file
without one is read from its first layer's tensors, so a key that contradicts them is named.

YaRN in a DeepSeek config carries `mscale` and `mscale_all_dim` (DeepSeek-V3: both 1.0):
transformers scales the rotary sin and cos by mscale(factor, mscale) / mscale(factor,
mscale_all_dim) (our `rotary_attention_factor`, when the config gives no attention_factor)
and every score by mscale(factor, mscale_all_dim)^2 (`rotary_mscale_all_dim`).
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.models import dense_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import Rows, Rule
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


def _sizes(defaults: Mapping[str, Any]):
  """Reads the sizes (a family's `defaults` where a config has none; a `q_lora_rank` of null
  is no bottleneck, not the default)."""
  def fields(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
    del found
    read = {field: config.get(key, defaults.get(field, default))
            for field, key, default in _SIZE_KEYS}
    if "q_lora_rank" in config.values:
      read["q_lora_rank"] = config.values["q_lora_rank"]
    if read["q_lora_rank"] == 0:  # A GGUF file's word for none (its config drops nulls).
      read["q_lora_rank"] = None
    return read
  return fields


def _size_config(model: Any) -> dict[str, Any]:
  return {key: getattr(model, field) for field, key, _ in _SIZE_KEYS}


def _size_metadata(model: Any) -> dict[str, Any]:
  """llama.cpp's keys: the latent ranks, the rotary width, the heads' widths with MLA, and
  the "MQA" form's key and value widths (kv_lora_rank + qk_rope, kv_lora_rank)."""
  found = {"attention.kv_lora_rank": model.kv_lora_rank,
           "rope.dimension_count": model.qk_rope_head_dim,
           "attention.key_length_mla": model.resolved_head_dim,
           "attention.value_length_mla": model.v_head_dim,
           "attention.key_length": model.kv_lora_rank + model.qk_rope_head_dim,
           "attention.value_length": model.kv_lora_rank}
  if model.q_lora_rank is not None:
    found["attention.q_lora_rank"] = model.q_lora_rank
  return found


def _size_from_metadata(metadata: Mapping[str, Any], arch: str,
                        tensors: Mapping[str, tuple[int, ...]], config: dict
                        ) -> dict[str, Any]:
  """Each size from its key, or where the file has none from the first layer's tensors (so a
  key that contradicts them is found and named: weights/gguf_header.py)."""
  def key(name: str) -> Any:
    return metadata.get(f"{arch}.{name}")

  def width(tensor: str, axis: int) -> int | None:
    shape = tensors.get(f"blk.0.{tensor}.weight")
    return None if shape is None else shape[axis]

  heads = key("attention.head_count") or 1
  rank = key("attention.kv_lora_rank") or width("attn_kv_a_norm", 0)
  q_rank = key("attention.q_lora_rank") or width("attn_q_a_norm", 0)
  latent = width("attn_kv_a_mqa", 0)
  rope = key("rope.dimension_count") or (
      None if latent is None or rank is None else latent - rank)
  query = width("attn_q_b" if q_rank else "attn_q", 0)
  head = key("attention.key_length_mla") or (None if query is None else query // heads)
  output = width("attn_output", 1)
  found = {"kv_lora_rank": rank, "q_lora_rank": q_rank or 0, "qk_rope_head_dim": rope,
           "qk_nope_head_dim": None if head is None or rope is None else head - rope,
           "v_head_dim": key("attention.value_length_mla") or (
               None if output is None else output // heads)}
  del config
  return {name: value for name, value in found.items() if value is not None}


# The latent attention's sizes (field, config.json key, transformers' default).
_SIZE_KEYS = (("q_lora_rank", "q_lora_rank", 1536), ("kv_lora_rank", "kv_lora_rank", 512),
              ("qk_rope_head_dim", "qk_rope_head_dim", 64),
              ("qk_nope_head_dim", "qk_nope_head_dim", 128), ("v_head_dim", "v_head_dim", 128))


# What the dense table says that latent attention derives or says otherwise.
DROPPED = ("head_dim", "attention.value_length", "rope.dimension_count",
           "num_key_value_heads", "rope_scaling")


def config_rows(*rows: Any, **defaults: Any) -> Rows:
  """The dense transformer's rows with latent attention's sizes (read from config.json,
  llama.cpp's keys or its tensors, and written to both) and rotary settings, then `rows` (a
  family's); each field of `defaults` read with that default."""
  sizes = {field: defaults.pop(field) for field, _, _ in _SIZE_KEYS if field in defaults}
  return dense_names.CONFIG.changed(drop=DROPPED).changed(
      Rule("kv_lora_rank", _sizes(sizes), _size_config, _size_from_metadata, _size_metadata),
      KV_HEADS, ROPE, *rows, **defaults)
