"""A transformer family's names in other weight formats, read from its tables: the bases every
family's names classes subclass (models/format_names.py's interfaces), implemented once over
the family's config rows (models/config_rows.py) and tensor rows (models/tensor_rows.py), and
the rows of its attention kinds that several families share (`sliding_pattern`,
`uniform_window`).

A family's names class is its tables and its quirks:

  @format_names.names_for(Llama)
  class LlamaHfNames(TransformerHfNames):
    model_type = "llama"
    architecture = "LlamaForCausalLM"
    config_rows = dense_names.CONFIG.changed(...)
    tensor_rows = dense_names.tensors(...)

and its GGUF names take both from it: the architecture's name, how llama.cpp's converter
rearranged its tensors (`rotary_pairs`, `norm_offset`), what it cannot hold (`check_writable`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Sequence

from lingvo_lite import run_fields
from lingvo_lite.errors import UsageError
from lingvo_lite.models import tensor_rows as tensor_rows_lib
from lingvo_lite.models.checkpoint_names import GgufTensor, HfConfig, TensorName
from lingvo_lite.models.config_rows import Rows, Rule
from lingvo_lite.models.format_names import GgufNames, HfNames, names_of
from lingvo_lite.models.tensor_rows import Tensor
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
  """A transformer family's Hugging Face names, from its tables. Every field but how the model
  is run must read back from its config.json, as the model computes with it (the attention
  kinds layer by layer, the window and the sliding layers' rotary settings where a layer
  slides).

  Attributes:
    config_rows: Its settings: our field, config.json key, GGUF key (models/config_rows.py).
    tensor_rows: Its tensors: our parameters, Hugging Face's and GGUF's tensor
      (models/tensor_rows.py).
  """

  config_rows: ClassVar[Rows]
  tensor_rows: ClassVar[tuple[Tensor, ...]]

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    return cls.config_rows.fields(config)

  def config(self) -> dict[str, Any]:
    return {"model_type": self.model_type, "architectures": [self.architecture],
            **self.config_rows.config(self.model)}

  def tensors(self) -> list[TensorName]:
    return tensor_rows_lib.hf_tensors(self.tensor_rows, self.model)

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


class TransformerGgufNames(GgufNames):
  """A transformer family's GGUF names: its Hugging Face names' tables, as llama.cpp's
  converter writes them for `architecture`.

  Attributes:
    rotary_pairs: The converter puts each head's rotary pairs side by side in the query and
      key rows (GGML's rope; its `llama`), where Hugging Face's rotate-half keeps them apart.
    norm_offset: What the converter adds to every norm's scale (Gemma's 1: the scale it
      computes with, 1 + weight).
    defaults: The config.json entries a file without their keys means (llama.cpp's defaults,
      where they are not transformers').
    slides: The architecture has sliding-window layers; one that has none cannot hold a model
      whose window is shorter than its context.
  """

  rotary_pairs: ClassVar[bool] = False
  norm_offset: ClassVar[float] = 0.0
  defaults: ClassVar[Mapping[str, Any]] = {}
  slides: ClassVar[bool] = False

  @classmethod
  def hf_names(cls) -> type[TransformerHfNames]:
    return names_of(cls.family, HfNames)

  @classmethod
  def hf_config(cls, metadata: Mapping[str, Any],
                tensors: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The config.json its rows read from a file's metadata; the vocabulary is the token
    table's rows unless a key says."""
    config = {"model_type": cls.hf_model_type(), **cls.defaults,
              "vocab_size": tensors.get("token_embd.weight", (None,))[0]}
    config = cls.hf_names().config_rows.from_metadata(metadata, tensors, config)
    return {name: value for name, value in config.items() if value is not None}

  def _tables(self) -> type[TransformerHfNames]:
    """The model's Hugging Face names (a subclass of the family may have its own)."""
    return names_of(type(self.model), HfNames)

  def metadata(self) -> dict[str, Any]:
    return self._tables().config_rows.metadata(self.model)

  def tensors(self) -> dict[str, GgufTensor]:
    return tensor_rows_lib.gguf_tensors(self._tables().tensor_rows, self.model,
                                        self.architecture, self.rotary_pairs, self.norm_offset)

  def check_writable(self) -> None:
    """Refuses a model with a tensor the architecture has no name for, or a window shorter
    than its context where the architecture has none."""
    model = self.model
    self.tensors()
    if (not self.slides and "sliding" in model.kinds_by_layer()
        and model.window < model.max_length):
      raise UsageError(f"model: a {model.family_name} model with a sliding window of "
                       f"{model.window} (Hugging Face's sliding_window): a GGUF "
                       f"{self.architecture} model has none and would attend to every "
                       "position; export --export_format=hf")


# ------------------------------------------------------------------------------ attention kinds


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


def sliding_pattern(period: int, window: int, period_keys: tuple[str, ...] = (),
                    gguf_window: str | None = None, **gguf: Any) -> Rule:
  """Layers that slide but for every `period`-th (a config's `period_keys` may give the
  period), unless `layer_types` lists them; the window `sliding_window` (`window` where the
  config has none) where a layer slides. `gguf_window`: the GGUF key of the window, read and
  written as it is; or `gguf`: the rule's own GGUF reading and writing (`Rule` fields)."""

  def fields(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
    every = next((config.get(key) for key in period_keys if config.get(key) is not None),
                 period)
    count = found["num_layers"]
    kinds = layer_kinds(config, ["sliding_attention" if (index + 1) % every else
                                 "full_attention" for index in range(count)], count)
    return {"layer_kinds": kinds,
            "window": config.get("sliding_window", window) if "sliding" in kinds else None}

  def written(model: Any) -> dict[str, Any]:
    sliding = "sliding" in model.kinds_by_layer()
    return {"sliding_window": model.window if sliding else None,
            "layer_types": layer_types(model)}

  if gguf_window is not None:
    gguf = dict(
        from_metadata=lambda metadata, arch, tensors, config: {
            "sliding_window": metadata.get(f"{arch}.{gguf_window}")},
        metadata=lambda model: {gguf_window: model.window})
  return Rule("sliding_window", fields, written, **gguf)


def uniform_window(switch: str | None = None) -> Rule:
  """Every layer slides over `sliding_window` where a config gives one (and its `switch` key
  is true), else every layer attends to the whole context."""

  def fields(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
    del found
    on = switch is None or config.flag(switch, False)
    window = config.get("sliding_window") if on else None
    return {"layer_kinds": ("sliding",) if window is not None else ("full",), "window": window}

  def written(model: Any) -> dict[str, Any]:
    sliding = "sliding" in model.kinds_by_layer()
    return {**({switch: sliding} if switch else {}),
            "sliding_window": model.window if sliding else None}

  return Rule("sliding_window", fields, written)
