"""Qwen3 (dense): Llama's blocks with an RMSNorm of each head's queries and keys.

Pre-RMSNorm blocks, a SwiGLU MLP, rotate-half rotary positions on every dim of each head,
grouped-query attention, no biases, and a `head_dim` of its own (128 at every size, whatever
the width over the heads: Qwen3-0.6B's 16 heads of 128 make 2048 from a width of 1024). The
query and key of each head are RMS-normalized before the rotary positions (`qk_norm="head"`,
one scale of head_dim each, shared by the heads). Small sizes tie the output to the embedding
(0.6B, 1.7B, 4B), larger ones do not.

Hugging Face's Qwen3 may slide a window over its upper layers (`use_sliding_window`,
`max_window_layers`, or `layer_types`); the released dense models do not, and their configs
read as full attention. A config that does reads as the shared transformer's attention kinds
(models/transformer_layers.py).

Hugging Face (`Qwen3ForCausalLM`, model_type "qwen3") and llama.cpp's GGUF architecture
`qwen3` (rotate-half rotary, so no query/key rows rearranged) name the tensors below.
"""

from __future__ import annotations

from typing import Any

from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import dense_names, format_names, layers
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import Rule
from lingvo_lite.models.llama import Llama, LlamaGgufNames, LlamaHfNames
from lingvo_lite.models.transformer_names import layer_kinds, layer_types


class Qwen3(Llama):
  """Qwen3: Llama's fields (their docs are `TransformerLM`'s) with Qwen3's choices."""

  norm_eps: PositiveFloat = 1e-6
  rotary_base: PositiveFloat = 1000000.0
  qk_norm: layers.QkNorm = "head"

  family_name = "qwen3"
  same_model_as = ()


def _upper_layers_slide(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  """The window where a layer slides: Hugging Face's `layer_types`, or its rule (with
  `use_sliding_window`, the layers from `max_window_layers` on slide)."""
  count = found["num_layers"]
  window = config.get("sliding_window") if config.flag("use_sliding_window", False) else None
  first_sliding = config.get("max_window_layers", 28)
  default = ["sliding_attention" if window is not None and index >= first_sliding
             else "full_attention" for index in range(count)]
  kinds = layer_kinds(config, default, count)
  return {"qk_norm": "head", "layer_kinds": kinds,
          "window": window if "sliding" in kinds else None}


def _sliding_upper_layers(model: Any) -> dict[str, Any]:
  sliding = "sliding" in model.kinds_by_layer()
  return {"use_sliding_window": sliding, "sliding_window": model.window if sliding else None,
          "max_window_layers": model.num_layers, "layer_types": layer_types(model)}


@format_names.names_for(Qwen3)
class Qwen3HfNames(LlamaHfNames):
  """Qwen3's Hugging Face names: Llama's, each layer's `q_norm` and `k_norm` (after every
  other tensor: the order the fingerprint of a folder's tensors has kept), and its windows."""

  model_type = "qwen3"
  architecture = "Qwen3ForCausalLM"
  config_rows = LlamaHfNames.config_rows.changed(
      Rule("sliding_window", _upper_layers_slide, _sliding_upper_layers))
  tensor_rows = LlamaHfNames.tensor_rows + dense_names.QK_NORMS


@format_names.names_for(Qwen3)
class Qwen3GgufNames(LlamaGgufNames):
  """llama.cpp's `qwen3`: Llama's names with the query and key norms, and no rows
  rearranged (GGML's rope there is rotate-half, as Hugging Face's)."""

  architecture = "qwen3"
  rotary_pairs = False
