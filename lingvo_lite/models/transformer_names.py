"""What every family built on `TransformerLM` shares in other weight formats: the bases of the
names classes of models/gptj.py, llama.py, gpt2.py and mistral.py (models/format_names.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from lingvo_lite import run_fields
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.format_names import GgufNames, HfNames
from lingvo_lite.models.transformer_layers import pattern_of

# Flax's own bookkeeping fields: no setting.
_FRAMEWORK_FIELDS = ("parent", "name")
# Sizes a config may leave to their derivation (None) or give: compared as derived.
_DERIVED = {"num_kv_heads": "resolved_num_kv_heads", "head_dim": "resolved_head_dim",
            "mlp_dim": "resolved_mlp_dim", "rotary_dim": "resolved_rotary_dim"}
# The rotary scaling's settings: compared as the scaling each kind of layer computes with
# (`rotary_scaling` and `sliding_rotary_scaling` below), so a setting no layer reads is not.
_SCALING_SETTINGS = ("rotary_scaling_factor", "rotary_low_freq_factor",
                     "rotary_high_freq_factor", "rotary_original_max_length",
                     "rotary_beta_fast", "rotary_beta_slow", "rotary_attention_factor",
                     "rotary_truncate")


class TransformerHfNames(HfNames):
  """A transformer family's Hugging Face names: every field but how the model is run must
  read back from its config.json, as the model computes with it (the attention kinds layer
  by layer, the window and the sliding layers' rotary settings where a layer slides)."""

  def expressed(self) -> dict[str, Any]:
    model = self.model
    unsaid = run_fields.names(type(model))  # How it is run or trained: no format says it.
    found = {field.name: getattr(model, _DERIVED.get(field.name, field.name))
             for field in dataclasses.fields(model)
             if field.name not in _FRAMEWORK_FIELDS + _SCALING_SETTINGS + unsaid}
    sliding = "sliding" in model.kinds_by_layer()
    found.update(
        layer_kinds=model.kinds_by_layer(), window=model.window if sliding else None,
        rotary_scaling=model.rotary_scaling_settings("full"),
        sliding_rotary_base=model.kind_fields("sliding")["rotary_base"] if sliding else None,
        sliding_rotary_scaling=model.rotary_scaling_settings("sliding") if sliding else None)
    return found


def layer_types(model: Any) -> list[str]:
  """Hugging Face's `layer_types` of a model: each layer's "full_attention" or
  "sliding_attention" (a kind Hugging Face has no name for is refused by the export's read
  back: it reads as full attention)."""
  return ["sliding_attention" if kind == "sliding" else "full_attention"
          for kind in model.kinds_by_layer()]


def layer_kinds(config: HfConfig, default: Sequence[str], num_layers: int
                ) -> tuple[str, ...]:
  """The pattern of attention kinds of a config.json's `layer_types` (the default: the
  family's own rule, one kind per layer), as `TransformerLM.layer_kinds` holds it."""
  types = config.get("layer_types", default)
  kinds = {"full_attention": "full", "sliding_attention": "sliding"}
  if (not isinstance(types, list) or len(types) != num_layers
      or any(t not in kinds for t in types)):
    raise config.refuse("layer_types", types, "must list 'full_attention' or "
                        f"'sliding_attention' for each of the {num_layers} layers",
                        "fix the file")
  return pattern_of([kinds[t] for t in types])


class TransformerGgufNames(GgufNames):
  """A transformer family's GGUF names: the sizes every architecture's metadata holds."""

  def metadata(self) -> dict[str, int | float | str]:
    """The sizes llama.cpp's converters write for every transformer architecture (keys without
    the architecture's prefix); each family adds its own settings."""
    model = self.model
    return {"vocab_size": model.vocab_size, "context_length": model.max_length,
            "embedding_length": model.dim, "block_count": model.num_layers,
            "feed_forward_length": model.resolved_mlp_dim,
            "attention.head_count": model.num_heads}


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
