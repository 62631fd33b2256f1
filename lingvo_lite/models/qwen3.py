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

from lingvo_lite.errors import UsageError
from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import format_names, layers
from lingvo_lite.models.checkpoint_names import GgufTensor, HfConfig, TensorName, norm
from lingvo_lite.models.llama import Llama, LlamaGgufNames, LlamaHfNames
from lingvo_lite.models.transformer_names import layer_kinds, layer_types


class Qwen3(Llama):
  """Qwen3: Llama's fields (their docs are `TransformerLM`'s) with Qwen3's choices."""

  norm_eps: PositiveFloat = 1e-6
  rotary_base: PositiveFloat = 1000000.0
  qk_norm: layers.QkNorm = "head"

  family_name = "qwen3"
  same_model_as = ()


def _without(config: HfConfig, *keys: str) -> HfConfig:
  return HfConfig({k: v for k, v in config.values.items() if k not in keys}, config.where)


@format_names.names_for(Qwen3)
class Qwen3HfNames(LlamaHfNames):
  """Qwen3's Hugging Face names: Llama's, and each layer's `q_norm` and `k_norm`."""

  model_type = "qwen3"
  architecture = "Qwen3ForCausalLM"

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    """Llama's fields, and the window where a layer slides: Hugging Face's `layer_types`, or
    its rule (with `use_sliding_window`, the layers from `max_window_layers` on slide)."""
    layers_count = config.require("num_hidden_layers")
    window = config.get("sliding_window") if config.flag("use_sliding_window", False) else None
    first_sliding = config.get("max_window_layers", 28)
    default = ["sliding_attention" if window is not None and index >= first_sliding
               else "full_attention" for index in range(layers_count)]
    kinds = layer_kinds(config, default, layers_count)
    fields = super().fields(_without(config, "sliding_window", "use_sliding_window"))
    return dict(fields, qk_norm="head", layer_kinds=kinds,
                window=window if "sliding" in kinds else None)

  def config(self) -> dict[str, Any]:
    model = self.model
    sliding = "sliding" in model.kinds_by_layer()
    return dict(super().config(), use_sliding_window=sliding,
                sliding_window=model.window if sliding else None,
                max_window_layers=model.num_layers, layer_types=layer_types(model))

  def tensors(self) -> list[TensorName]:
    names = super().tensors()
    for index in range(self.model.num_layers):
      hf, ours = f"model.layers.{index}.self_attn.", f"layer_{index}/attention/"
      names += norm(f"{hf}q_norm", f"{ours}query_norm", False)
      names += norm(f"{hf}k_norm", f"{ours}key_norm", False)
    return names


@format_names.names_for(Qwen3)
class Qwen3GgufNames(LlamaGgufNames):
  """llama.cpp's `qwen3`: Llama's names with the query and key norms, and no rows
  rearranged (GGML's rope there is rotate-half, as Hugging Face's)."""

  architecture = "qwen3"

  def check_writable(self) -> None:
    model = self.model
    if "sliding" in model.kinds_by_layer():
      raise UsageError(f"model: a {model.family_name} model with sliding layers (Hugging "
                       f"Face's layer_types): a GGUF {self.architecture} model has none and "
                       "would attend to every position; export --export_format=hf")
    super().check_writable()

  def tensors(self) -> dict[str, GgufTensor]:
    names = super().tensors()
    for index in range(self.model.num_layers):
      gguf, hf = f"blk.{index}.", f"model.layers.{index}.self_attn."
      names[f"{gguf}attn_q.weight"] = GgufTensor(f"{hf}q_proj.weight")
      names[f"{gguf}attn_k.weight"] = GgufTensor(f"{hf}k_proj.weight")
      names[f"{gguf}attn_q_norm.weight"] = GgufTensor(f"{hf}q_norm.weight")
      names[f"{gguf}attn_k_norm.weight"] = GgufTensor(f"{hf}k_norm.weight")
    return names
