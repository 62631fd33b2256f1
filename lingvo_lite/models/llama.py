"""Llama: the shared transformer with Llama's choices as its defaults.

Sequential pre-RMSNorm blocks, a SwiGLU MLP, rotate-half rotary embedding on every dim of each
head, grouped-query attention where `num_kv_heads` is set, and no biases. Experiments give the
sizes: `fdl.Config(Llama, vocab_size=32000, num_layers=32, dim=4096, ...)`, or take them from
a Hugging Face folder (`LlamaHfNames.fields`, weights/hf_checkpoint.py).

Hugging Face's Llama rotates halves of each head (`rotate_half`), as `rotary_style="half"`
does, so its query and key weights load as they are; its SwiGLU is down(silu(gate(x)) * up(x)),
our `wi` (activated) and `wi_gate` (multiplied).
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.errors import UsageError
from lingvo_lite.models import dense_names, format_names, layers
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import Rule
from lingvo_lite.models.transformer import TransformerLM
from lingvo_lite.models.transformer_names import TransformerGgufNames, TransformerHfNames


class Llama(TransformerLM):
  """Llama: `TransformerLM`'s fields (their docs are there), with Llama's choices as defaults
  where `TransformerLM`'s are not (sequential pre-norm blocks, rotate-half rotary positions,
  no biases, an untied output: those are)."""

  norm: layers.NormKind = "rmsnorm"
  mlp_activation: layers.Activation = "swiglu"

  family_name = "llama"
  same_model_as = ("lingvo_lite.models.transformer.TransformerLM",)


def _whole_context(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  """A sliding window (where `use_sliding_window` does not turn it off) is refused: Llama
  attends to the whole context."""
  del found
  if config.get("sliding_window") is not None and config.get("use_sliding_window", True):
    raise config.refuse("sliding_window", config.get("sliding_window"),
                        f"the {config.get('model_type')} family attends to the whole "
                        "context",
                        "use a Mistral config (model_type 'mistral') for a sliding window")
  return {}


@format_names.names_for(Llama)
class LlamaHfNames(TransformerHfNames):
  """Llama's Hugging Face names: the dense transformer's table as it is."""

  model_type = "llama"
  architecture = "LlamaForCausalLM"
  config_rows = dense_names.CONFIG.changed(Rule("sliding_window", _whole_context))
  tensor_rows = dense_names.tensors(*dense_names.LLAMA_LAYER)


@format_names.names_for(Llama)
class LlamaGgufNames(TransformerGgufNames):
  """llama.cpp's `llama`: each head's query and key rows hold their rotary pairs side by side
  (GGML's rope), where Hugging Face's rotate-half keeps the halves apart; a file without
  `rope.freq_base` rotates with llama.cpp's base, 10,000."""

  architecture = "llama"
  rotary_pairs = True
  defaults = {"rope_theta": 10000.0}

  @classmethod
  def reads_file(cls, metadata: Mapping[str, Any]) -> bool:
    """A `llama` file without experts (one with `expert_count` is Mixtral's)."""
    return not metadata.get(f"{metadata.get('general.architecture')}.expert_count")

  def check_writable(self) -> None:
    """Refuses rotary scaling: llama.cpp stores Llama 3.1's as a rope_freqs tensor, which this
    writer does not make."""
    if self.model.rotary_scaling != "none":
      raise UsageError(f"model: rope scaling {self.model.rotary_scaling!r}: this GGUF writer "
                       "does not store it (llama.cpp's rope_freqs tensor); export "
                       "--export_format=hf")
    super().check_writable()
