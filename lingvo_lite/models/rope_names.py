"""A transformer's rotary positions in other formats: its base and scaling as Hugging Face's
config.json and llama.cpp's GGUF metadata say them, read and written by the rows here
(models/config_rows.py): `ROTARY_BASE` and `ROPE_SCALING`, one setting for every layer (Llama's
`rope_theta` and `rope_scaling`), and `per_kind_rope`, settings of each kind of layer (Gemma 3's
and OLMo 3's transformers 5 `rope_parameters` by layer type).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from lingvo_lite.errors import UsageError
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import ROPE_THETA, Key, Rule

# Hugging Face's rope types this transformer computes (models/rotary.py).
ROPE_TYPES = ("llama3", "linear", "yarn")


def rotary_scaling_fields(config: HfConfig, scaling: Mapping[str, Any] | None, key: str,
                          field: str = "rotary_scaling", *, max_length: int
                          ) -> dict[str, Any]:
  """The fields of a Hugging Face rope scaling (`rope_scaling`, or an entry of
  `rope_parameters` beyond its base; `key` names it in messages): `field` ("rotary_scaling"
  or "sliding_rotary_scaling") and the settings its kind reads.

  The original context of Llama 3.1's and YaRN's scaling is as transformers fills it
  (`RotaryEmbeddingConfigMixin.standardize_rope_params`): the scaling's own
  `original_max_position_embeddings`, else the model's context, `max_length` (its
  `max_position_embeddings`). (A top-level key of that name counts only for a config class
  that declares it, Phi-3's; no family here.)

  Raises:
    UsageError: a kind or setting this transformer does not compute, naming the key.
  """
  if scaling is None:
    return {}
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind == "default":
    return {}
  if kind not in ROPE_TYPES:
    raise config.refuse(f"{key}.rope_type", kind, "lingvo_lite's rotary positions implement "
                        "only Llama 3.1's, linear and YaRN scaling",
                        f"supported: 'default', {', '.join(map(repr, ROPE_TYPES))}")
  settings = HfConfig(scaling, config.where)
  fields = {field: kind, "rotary_scaling_factor": settings.number("factor", 8.0)}
  original = settings.get("original_max_position_embeddings", max_length)
  if kind == "llama3":
    fields.update(rotary_low_freq_factor=settings.number("low_freq_factor", 1.0),
                  rotary_high_freq_factor=settings.number("high_freq_factor", 4.0),
                  rotary_original_max_length=original)
  elif kind == "yarn":
    for unsupported in ("mscale", "mscale_all_dim"):
      if settings.get(unsupported) is not None:
        raise config.refuse(f"{key}.{unsupported}", settings.get(unsupported),
                            "lingvo_lite's YaRN takes its attention factor alone",
                            "give attention_factor instead")
    fields.update(rotary_truncate=settings.flag("truncate", True),
                  rotary_original_max_length=original,
                  rotary_beta_fast=settings.number("beta_fast", 32.0),
                  rotary_beta_slow=settings.number("beta_slow", 1.0),
                  rotary_attention_factor=settings.number("attention_factor"))
  return fields


def rope_scaling(settings: tuple[Any, ...]) -> dict[str, Any] | None:
  """Hugging Face's rope scaling of a layer kind's `rotary_scaling_settings` (None for none):
  the inverse of `rotary_scaling_fields`."""
  if not settings:
    return None
  kind, factor = settings[0], settings[1]
  if kind == "linear":
    return {"rope_type": "linear", "factor": factor}
  if kind == "yarn":
    _, _, original, beta_fast, beta_slow, attention, truncate = settings
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original,
            "beta_fast": beta_fast, "beta_slow": beta_slow, "attention_factor": attention,
            **({} if truncate else {"truncate": False})}
  _, _, low, high, original = settings
  return {"rope_type": kind, "factor": factor, "low_freq_factor": low,
          "high_freq_factor": high, "original_max_position_embeddings": original}


def per_kind_rotary_fields(config: HfConfig, full_base: float, sliding_base_key: str | None,
                           sliding_base: float, *, max_length: int) -> dict[str, Any]:
  """The rotary fields of a config whose layer types have rotary settings of their own:
  transformers 5's `rope_parameters` by layer type ({"full_attention": {...},
  "sliding_attention": {...}}), or the older keys (`rope_theta` and `rope_scaling` for the
  full layers; the sliding layers' base under `sliding_base_key`, else the full layers').
  The sliding layers' scaling is set explicitly ("none" where unscaled), since unset it
  would follow the full layers'. `max_length`: the model's context (`rotary_scaling_fields`).

  Raises:
    UsageError: a setting this transformer does not compute, naming the key.
  """
  by_type = config.mapping("rope_parameters")
  if "full_attention" in by_type or "sliding_attention" in by_type:
    for layer_type in ("full_attention", "sliding_attention"):
      if not isinstance(by_type.get(layer_type) or {}, dict):
        raise config.refuse(f"rope_parameters.{layer_type}", by_type[layer_type],
                            "must be a JSON object", "fix the file")
    full = by_type.get("full_attention") or {}
    sliding = by_type.get("sliding_attention") or {}
    bases = (HfConfig(full, config.where).number("rope_theta", full_base),
             HfConfig(sliding, config.where).number("rope_theta", sliding_base))
    keys = ("rope_parameters.full_attention", "rope_parameters.sliding_attention")
  else:
    base = config.rope_theta(full_base)
    bases = (base, config.number(sliding_base_key, sliding_base) if sliding_base_key
             else base)
    full, sliding = config.rope_scaling(), None
    keys = ("rope_scaling", "rope_scaling")
  fields = {"rotary_base": bases[0], "sliding_rotary_base": bases[1]}
  full_fields = rotary_scaling_fields(config, full, keys[0], max_length=max_length)
  sliding_fields = rotary_scaling_fields(config, sliding, keys[1], "sliding_rotary_scaling",
                                         max_length=max_length)
  shared = set(full_fields) & set(sliding_fields) - {"rotary_scaling", "sliding_rotary_scaling"}
  if any(full_fields[key] != sliding_fields[key] for key in shared):
    raise config.refuse(keys[1], sliding, "lingvo_lite's sliding layers scale with the full "
                        "layers' factor and lengths", "give both the same settings")
  return {**fields, **full_fields, **sliding_fields,
          "sliding_rotary_scaling": sliding_fields.get("sliding_rotary_scaling", "none")}


def per_kind_rope_parameters(model: Any) -> dict[str, Any]:
  """transformers 5's `rope_parameters` by layer type of a model: the inverse of
  `per_kind_rotary_fields`."""
  found = {}
  for layer_type, kind in (("full_attention", "full"), ("sliding_attention", "sliding")):
    scaling = rope_scaling(model.rotary_scaling_settings(kind)) or {"rope_type": "default"}
    found[layer_type] = {**scaling, "rope_theta": model.kind_fields(kind)["rotary_base"]}
  return {"rope_parameters": found}


# ------------------------------------------------------------------------------ rows

# The rotary base of every layer: `rope_parameters.rope_theta` or `rope_theta` (written as
# `rope_theta`), llama.cpp's `rope.freq_base`.
ROTARY_BASE = Key("rotary_base", "rope_theta", "rope.freq_base", 10000.0, ROPE_THETA)


def _scaling_fields(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  return rotary_scaling_fields(config, config.rope_scaling(), "rope_scaling",
                               max_length=found["max_length"])


def _scaling_config(model: Any) -> dict[str, Any]:
  if model.rotary_scaling == "none":
    return {}
  return {"rope_scaling": rope_scaling(model.rotary_scaling_settings("full"))}


def _scaling_from_metadata(metadata: Mapping[str, Any], arch: str,
                           tensors: Mapping[str, tuple[int, ...]], config: dict
                           ) -> dict[str, Any]:
  """llama.cpp's `rope.scaling.type` (its settings as transformers' defaults); a file that
  stores Llama 3.1's scaling as a `rope_freqs` tensor is refused."""
  del config
  if "rope_freqs.weight" in tensors:
    raise UsageError(f"{arch}: the file scales its rotary frequencies by a rope_freqs tensor "
                     "(Llama 3.1's scaling as llama.cpp stores it), which lingvo_lite does "
                     "not read yet; use the model's Hugging Face folder (hf:PATH)")
  kind = metadata.get(f"{arch}.rope.scaling.type")
  return {} if kind in (None, "none") else {"rope_scaling": {"rope_type": kind}}


# One rope scaling for every layer: config.json's `rope_scaling` (or `rope_parameters` beyond
# its base), llama.cpp's `rope.scaling.type` (no GGUF writer stores one: `check_writable`).
ROPE_SCALING = Rule("rope_scaling", _scaling_fields, _scaling_config, _scaling_from_metadata)


def per_kind_rope(full_base: float, sliding_base_key: str | None, sliding_base: float,
                  from_metadata: Callable[..., dict[str, Any]],
                  metadata: Callable[[Any], dict[str, Any]]) -> Rule:
  """The rotary settings of each kind of layer (`per_kind_rotary_fields`; written as
  transformers 5's `rope_parameters` by layer type), read from and written to a GGUF
  architecture's keys by `from_metadata` and `metadata` (each architecture has its own)."""
  return Rule(
      "rope_parameters",
      lambda config, found: per_kind_rotary_fields(
          config, full_base, sliding_base_key, sliding_base, max_length=found["max_length"]),
      per_kind_rope_parameters, from_metadata, metadata)
