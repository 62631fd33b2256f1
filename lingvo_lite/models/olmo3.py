"""OLMo 3: three sliding-window layers to one full, norms after attention and MLP only, and an
RMSNorm of the whole query and key projections.

Choices, each a field of the shared transformer (models/transformer.py):

- layers: a pattern of three "sliding" layers (a window of 4096 positions) and one "full",
  repeated; both kinds rotate with base 500,000, and the full layers may scale their
  frequencies (YaRN, as the long-context releases do) where the sliding ones do not;
- "post_norm" blocks: x + norm(attention(x)), then x + norm(mlp(x)), no norm before either
  (OLMo 2's reordering);
- RMSNorm of queries and keys over the whole projection, before the rotary positions
  (`qk_norm="projection"`: a scale per head and feature), a SwiGLU MLP, grouped-query heads,
  no biases, an untied output.

Hugging Face: `Olmo3ForCausalLM` (model_type "olmo3"), whose head width is always the width
over the heads. GGUF: llama.cpp's converter writes OLMo 3 as its `olmo2` architecture (OLMo
2's blocks, which OLMo 3 kept), with `attention.sliding_window` and a per-layer
`attention.sliding_window_pattern` of booleans, and YaRN's `rope.scaling.*` keys for the full
layers; llama.cpp's olmo2 computes the head width as the width over the heads and never scales
the sliding layers. The `gguf` package reads and writes those keys; transformers has no olmo2
GGUF reader, so our reader is the other end of a round trip. An olmo2 file without a window
(OLMo 2) reads as this family with every layer full.
"""

from __future__ import annotations

from typing import Any, Mapping

from lingvo_lite.errors import UsageError
from lingvo_lite.fields import PositiveFloat, PositiveInt
from lingvo_lite.models import dense_names, format_names, layers
from lingvo_lite.models.block import BlockKind
from lingvo_lite.models.config_rows import Key
from lingvo_lite.models.dense_names import ATTENTION, BLOCK, LAYER, norm, swiglu
from lingvo_lite.models.rope_names import per_kind_rope
from lingvo_lite.models.tensor_rows import vector
from lingvo_lite.models.transformer import RotaryScaling, TransformerLM
from lingvo_lite.models.transformer_layers import LayerKind
from lingvo_lite.models.transformer_names import (TransformerGgufNames, TransformerHfNames,
                                                  sliding_pattern)

PATTERN: tuple[LayerKind, ...] = ("sliding",) * 3 + ("full",)


class Olmo3(TransformerLM):
  """OLMo 3: `TransformerLM`'s fields (their docs are there), with OLMo 3's choices as
  defaults where they are not `TransformerLM`'s (rotate-half rotary positions, no biases, an
  untied output)."""

  block: BlockKind = "post_norm"
  norm: layers.NormKind = "rmsnorm"
  norm_eps: PositiveFloat = 1e-6
  mlp_activation: layers.Activation = "swiglu"
  rotary_base: PositiveFloat = 500000.0
  layer_kinds: tuple[LayerKind, ...] = PATTERN
  window: PositiveInt | None = 4096
  sliding_rotary_scaling: RotaryScaling | None = "none"
  qk_norm: layers.QkNorm = "projection"

  family_name = "olmo3"
  same_model_as = ()


def _window_from_metadata(metadata: Mapping[str, Any], arch: str, tensors: Any, config: dict
                          ) -> dict[str, Any]:
  """The window and the layers it slides in: `attention.sliding_window_pattern` (a boolean
  per layer, or a period whose last layer is full; llama.cpp's default for OLMo 3: 3 of
  4); no window (OLMo 2): every layer full."""
  del tensors
  layers_count = config.get("num_hidden_layers", 0)
  window = metadata.get(f"{arch}.attention.sliding_window")
  if not window:
    return {"layer_types": ["full_attention"] * layers_count}
  pattern = metadata.get(f"{arch}.attention.sliding_window_pattern")
  if isinstance(pattern, int):  # A period: every layer but each period's last slides.
    pattern = [(index + 1) % pattern != 0 for index in range(layers_count)]
  elif pattern is None:
    pattern = [(index + 1) % 4 != 0 for index in range(layers_count)]
  return {"sliding_window": window, "layer_types": [
      "sliding_attention" if slides else "full_attention" for slides in pattern]}


def _window_metadata(model: Any) -> dict[str, Any]:
  kinds = model.kinds_by_layer()
  if "sliding" not in kinds:
    return {}
  return {"attention.sliding_window": int(model.window),
          "attention.sliding_window_pattern": [kind == "sliding" for kind in kinds]}


def _rope_from_metadata(metadata: Mapping[str, Any], arch: str, tensors: Any, config: dict
                        ) -> dict[str, Any]:
  """Both kinds' base (`rope.freq_base`, the sliding layers' `rope.freq_base_swa` where it
  differs), the full layers' YaRN (`rope.scaling.*`)."""
  del tensors, config
  base = metadata.get(f"{arch}.rope.freq_base", 10000.0)
  full = {"rope_type": "default", "rope_theta": base}
  if metadata.get(f"{arch}.rope.scaling.type") == "yarn":
    full.update(rope_type="yarn", factor=metadata.get(f"{arch}.rope.scaling.factor"),
                attention_factor=metadata.get(f"{arch}.rope.scaling.attn_factor"),
                original_max_position_embeddings=metadata.get(
                    f"{arch}.rope.scaling.original_context_length"),
                beta_fast=metadata.get(f"{arch}.rope.scaling.yarn_beta_fast", 32.0),
                beta_slow=metadata.get(f"{arch}.rope.scaling.yarn_beta_slow", 1.0))
  return {"rope_parameters": {"full_attention": full, "sliding_attention": {
      "rope_type": "default", "rope_theta": metadata.get(f"{arch}.rope.freq_base_swa", base)}}}


def _rope_metadata(model: Any) -> dict[str, Any]:
  found = {"rope.freq_base": float(model.rotary_base)}
  sliding_base = model.kind_fields("sliding")["rotary_base"]
  if "sliding" in model.kinds_by_layer() and sliding_base != model.rotary_base:
    found["rope.freq_base_swa"] = float(sliding_base)
  settings = model.rotary_scaling_settings("full")
  if settings:
    _, factor, original, beta_fast, beta_slow, attention, _ = settings
    found.update({"rope.scaling.type": "yarn", "rope.scaling.factor": float(factor),
                  "rope.scaling.attn_factor": float(attention),
                  "rope.scaling.original_context_length": int(original),
                  "rope.scaling.yarn_beta_fast": float(beta_fast),
                  "rope.scaling.yarn_beta_slow": float(beta_slow)})
  return found


@format_names.names_for(Olmo3)
class Olmo3HfNames(TransformerHfNames):
  """OLMo 3's Hugging Face names: keys a config leaves out take transformers' defaults of
  `Olmo3Config`; no `head_dim` is written (transformers' OLMo 3 always takes the width over
  the heads: a model whose heads are otherwise is refused by the read back)."""

  model_type = "olmo3"
  architecture = "Olmo3ForCausalLM"
  config_rows = dense_names.CONFIG.changed(
      Key("head_dim", "head_dim", None, None, written=False),
      sliding_pattern(4, 4096, from_metadata=_window_from_metadata, metadata=_window_metadata),
      per_kind_rope(500000.0, None, 500000.0, _rope_from_metadata, _rope_metadata),
      drop=("mlp_bias", "attention.value_length", "rope.dimension_count", "rope_theta",
            "rope_scaling"),
      norm_eps=1e-5)
  # The query and key norms: [heads * head_dim] vectors, ours [heads, head_dim].
  tensor_rows = dense_names.tensors(
      ATTENTION,
      tuple(vector(f"layer_{{i}}/attention/{ours}_norm/scale", f"{LAYER}self_attn.{x}_norm.weight",
                   f"{BLOCK}attn_{x}_norm.weight") for ours, x in (("query", "q"), ("key", "k"))),
      norm("attention_post_norm", "post_attention_layernorm", "post_attention_norm"),
      swiglu(bias=False), norm("mlp_post_norm", "post_feedforward_layernorm", "post_ffw_norm"))


@format_names.names_for(Olmo3)
class Olmo3GgufNames(TransformerGgufNames):
  """llama.cpp's `olmo2`, as its converter writes OLMo 3 (module doc)."""

  architecture = "olmo2"
  slides = True

  def check_writable(self) -> None:
    """Refuses what llama.cpp's olmo2 computes otherwise: another head width than the width
    over the heads, scaled sliding layers, a full layers' scaling other than YaRN."""
    model = self.model
    problem = None
    if model.resolved_head_dim * model.num_heads != model.dim:
      problem = (f"head_dim={model.resolved_head_dim} (llama.cpp's olmo2 takes "
                 f"dim / num_heads = {model.dim // model.num_heads})")
    elif model.rotary_scaling_settings("sliding"):
      problem = "rotary scaling on the sliding layers"
    elif model.rotary_scaling not in ("none", "yarn"):
      problem = f"rope scaling {model.rotary_scaling!r}"
    elif model.rotary_scaling == "yarn" and not model.rotary_truncate:
      problem = "YaRN with an unrounded correction range (rotary_truncate=False)"
    elif "no_rotary" in model.kinds_by_layer():
      problem = "layers without rotary positions"
    if problem:
      raise UsageError(f"model: {problem}: a GGUF {self.architecture} model cannot express "
                       "it; export --export_format=hf")
    super().check_writable()
