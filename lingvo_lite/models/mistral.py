"""Mistral: Llama's blocks with sliding-window attention, and a decode cache of only the window.

Each token attends to itself and the `window - 1` tokens before it (the band 0 <= i - j <
window of the causal triangle), in every layer; information from further back reaches it only
through the layers below. Everything else is Llama's (pre-RMSNorm blocks, SwiGLU, rotate-half
RoPE, grouped-query key/value heads, no biases), so the parameters are Llama's tree.

The window is the shared transformer's sliding attention kind (models/transformer_layers.py:
every layer "sliding"): the band in every training path, FLOPs that count only the window,
`tiny`'s smaller window, and a decode cache that is a ring of min(window, cache_length) entries
per slot (models/kv_cache.py). This module is the family's defaults and its names in other
weight formats. Nothing outside `lingvo_lite/models/` names it.
"""

from __future__ import annotations

from typing import Any

from lingvo_lite.fields import PositiveInt
from lingvo_lite.models import format_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import Rule
from lingvo_lite.models.llama import Llama, LlamaGgufNames, LlamaHfNames
from lingvo_lite.models.transformer_layers import LayerKind


class Mistral(Llama):
  """Mistral: Llama's fields (their docs are `TransformerLM`'s) and a sliding window.

  Attributes:
    window: Positions each token attends to in every layer, its own included (Mistral-7B:
      4096); the decode cache holds this many positions per slot at most.
  """

  window: PositiveInt = 4096
  layer_kinds: tuple[LayerKind, ...] = ("sliding",)

  family_name = "mistral"
  same_model_as = ()


def _window(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  """Hugging Face's `sliding_window` (query i sees key j where i - j < sliding_window, this
  band); none means the whole context."""
  window = config.get("sliding_window")
  return {"window": window if window is not None else found["max_length"]}


@format_names.names_for(Mistral)
class MistralHfNames(LlamaHfNames):
  """Mistral's Hugging Face names: Llama's, and the window as `sliding_window`."""

  model_type = "mistral"
  architecture = "MistralForCausalLM"
  config_rows = LlamaHfNames.config_rows.changed(
      Rule("sliding_window", _window, lambda model: {"sliding_window": model.window}))


@format_names.names_for(Mistral)
class MistralGgufNames(LlamaGgufNames):
  """llama.cpp converts Mistral-7B to its `llama` architecture, whose files have no window: a
  reader takes a `llama` file as Llama's (models/format_names.py), and only a model whose
  window covers its whole context is written as one (`check_writable`)."""
