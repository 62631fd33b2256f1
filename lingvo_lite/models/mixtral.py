"""Mixtral: Mistral's attention with a mixture of 8 SwiGLU experts, 2 per token, in every layer.

Llama's blocks (pre-RMSNorm, rotate-half rotary positions, grouped-query attention, no
biases) whose MLP is models/moe.py's layer: a softmax router over 8 experts, the top 2
renormalized to sum to 1 (Mixtral always renormalizes), no shared expert. Mixtral-8x7B
attends to its whole context (`sliding_window` null in its config); a config with a window
reads as every layer "sliding" (Mistral's band and ring cache).

Hugging Face (`MixtralForCausalLM`, model_type "mixtral") stores the router as
`block_sparse_moe.gate` and each expert's w1 (gate: our `wi`), w3 (up: `wi_gate`) and w2 (down:
`wo`) as tensors of their own; llama.cpp converts Mixtral to its `llama` architecture with
`expert_count` and the experts stacked (`ffn_{gate,up,down}_exps`, the router `ffn_gate_inp`).
transformers does not read a Mixtral GGUF file; ours does.
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import dense_names, format_names, layers, moe_names
from lingvo_lite.models.config_rows import Key
from lingvo_lite.models.dense_names import BLOCK, LAYER, attention, norm
from lingvo_lite.models.llama import LlamaGgufNames
from lingvo_lite.models.moe_transformer import MoeTransformerLM
from lingvo_lite.models.tensor_rows import Tensor
from lingvo_lite.models.transformer_names import uniform_window


class Mixtral(MoeTransformerLM):
  """Mixtral: `MoeTransformerLM`'s fields (their docs are there and `TransformerLM`'s) with
  Mixtral's choices as defaults where they are not `TransformerLM`'s."""

  norm: layers.NormKind = "rmsnorm"
  mlp_activation: layers.Activation = "swiglu"
  rotary_base: PositiveFloat = 1000000.0

  family_name = "mixtral"
  same_model_as = ()


@format_names.names_for(Mixtral)
class MixtralHfNames(moe_names.MoeHfNames):
  """Mixtral's Hugging Face names: `intermediate_size` is the experts' width; no biases; the
  router `block_sparse_moe.gate`, each expert's w1 (gate: our `wi`), w3 (up: `wi_gate`) and
  w2 (down: `wo`)."""

  model_type = "mixtral"
  architecture = "MixtralForCausalLM"
  config_rows = moe_names.CONFIG.changed(
      Key("mlp_dim", "intermediate_size", "feed_forward_length",
          source="resolved_expert_mlp_dim"),
      moe_names.no_jitter(written=True), uniform_window(),
      drop=("attention_bias", "mlp_bias"),
      norm_eps=1e-5, rotary_base=1000000.0, max_length=4096 * 32)
  tensor_rows = dense_names.tensors(
      norm("attention_norm", "input_layernorm", "attn_norm"), attention(bias=False),
      norm("mlp_norm", "post_attention_layernorm", "ffn_norm"),
      (Tensor("layer_{i}/mlp/router_kernel", f"{LAYER}block_sparse_moe.gate.weight",
              f"{BLOCK}ffn_gate_inp.weight"),),
      moe_names.experts(f"{LAYER}block_sparse_moe.experts.{{expert}}.{{projection}}.weight",
                        BLOCK, (("w1", "wi", "gate"), ("w3", "wi_gate", "up"),
                                ("w2", "wo", "down"))))


@format_names.names_for(Mixtral)
class MixtralGgufNames(LlamaGgufNames):
  """llama.cpp's `llama` with experts (`expert_count`): Llama's names, each layer's
  feed-forward the router (`ffn_gate_inp`) and the stacked experts."""

  @classmethod
  def reads_file(cls, metadata: Mapping[str, Any]) -> bool:
    return bool(metadata.get(f"{metadata.get('general.architecture')}.expert_count"))
