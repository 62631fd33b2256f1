"""The shared transformer with multi-head latent attention (models/latent_attention.py): the
base of the DeepSeek families (deepseek_v3.py, deepseek_v2.py) and anything else built on MLA.

Its fields are `TransformerLM`'s plus the latent attention's sizes; `head_dim` and
`num_kv_heads` are derived (qk_nope + qk_rope, and every head its own key and value), and
the rotary positions turn the last `qk_rope_head_dim` features of each query head and the
shared rotary key, interleaved (DeepSeek's pairs). Every layer attends to the whole context.

The decode cache holds per layer and token the latent and the rotary key, kv_lora_rank +
qk_rope_head_dim values (`cache_widths`), attended in the absorbed form; its sizes, FLOPs
and checks below count what this attention computes.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn

from lingvo_lite.errors import config_error
from lingvo_lite.fields import NonNegativeFloat, PositiveFloat, PositiveInt
from lingvo_lite.models import layers
from lingvo_lite.models.attention_kernels.latent import LAYOUT
from lingvo_lite.models.latent_attention import LatentAttention, yarn_mscale
from lingvo_lite.models.transformer import TransformerLM

# The fields the latent attention derives: a config sets none of them.
_DERIVED = ("num_kv_heads", "head_dim", "rotary_dim", "query_pre_attention_scalar")


class LatentTransformerLM(TransformerLM):
  """`TransformerLM`'s fields (their docs are there) with latent attention's sizes.

  Attributes:
    q_lora_rank: The queries' bottleneck width; None: a full query projection (V2-Lite).
    kv_lora_rank: The compressed latent's width (the cache's, with the rotary key).
    qk_nope_head_dim: Each head's query and key features without rotary positions.
    qk_rope_head_dim: Each head's rotated query features and the shared rotary key's width
      (even: its features turn in pairs).
    v_head_dim: Each head's value width.
    rotary_mscale_all_dim: YaRN's `mscale_all_dim`: the scores are scaled by the square of
      0.1 x this x ln(rotary_scaling_factor) + 1 where the rotary positions are scaled; 0:
      not (transformers' `yarn_apply_mscale`).
  """

  norm: layers.NormKind = "rmsnorm"
  norm_eps: PositiveFloat = 1e-6
  mlp_activation: layers.Activation = "swiglu"
  rotary_style: layers.RotaryStyle = "interleaved"
  q_lora_rank: PositiveInt | None = 1536
  kv_lora_rank: PositiveInt = 512
  qk_nope_head_dim: PositiveInt = 128
  qk_rope_head_dim: PositiveInt = 64
  v_head_dim: PositiveInt = 128
  rotary_mscale_all_dim: NonNegativeFloat = 0.0

  same_model_as = ()

  @property
  def resolved_head_dim(self) -> int:
    return self.qk_nope_head_dim + self.qk_rope_head_dim

  @property
  def resolved_num_kv_heads(self) -> int:
    return self.num_heads

  @property
  def resolved_rotary_dim(self) -> int:
    return self.qk_rope_head_dim if self.position == "rotary" else 0

  @nn.nowrap
  def attention_scale(self) -> float:
    """What the scores are multiplied by: 1/sqrt(head width), times YaRN's mscale squared."""
    scale = self.resolved_head_dim ** -0.5
    if self.rotary_scaling != "none" and self.rotary_mscale_all_dim:
      scale *= yarn_mscale(self.rotary_scaling_factor, self.rotary_mscale_all_dim) ** 2
    return scale

  @nn.nowrap
  def attention_module(self) -> tuple[type[layers.Attention], dict[str, Any]]:
    return LatentAttention, {"q_lora_rank": self.q_lora_rank or 0,
                             "kv_lora_rank": self.kv_lora_rank, "v_head_dim": self.v_head_dim,
                             "attention_scale": self.attention_scale()}

  @classmethod
  def logical_axes(cls) -> dict[str, str]:
    return dict(super().logical_axes(), latent="kv_lora_rank", q_lora="q_lora_rank",
                kv_lora="kv_lora_rank")

  @classmethod
  def int8_weight_contractions(cls) -> dict[tuple[str, ...], tuple[str, ...]]:
    """And the latent's projections: down [embed, latent], up [q_lora or kv_lora, heads,
    kv]."""
    return {**super().int8_weight_contractions(), ("embed", "latent"): ("embed",),
            ("q_lora", "heads", "kv"): ("q_lora",), ("kv_lora", "heads", "kv"): ("kv_lora",)}

  # ---------------------------------------------------------------------------- sizes

  @nn.nowrap
  def _attention_matrices(self) -> int:
    dim, heads, rank = self.dim, self.num_heads, self.kv_lora_rank
    query = (dim * heads * self.resolved_head_dim if not self.q_lora_rank else
             self.q_lora_rank * (dim + heads * self.resolved_head_dim))
    latent = dim * (rank + self.qk_rope_head_dim)
    up = rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
    return query + latent + up + heads * self.v_head_dim * dim

  @nn.nowrap
  def attention_parameters(self) -> int:
    """The matrices, the query's and the latent's norms, and with `attention_bias` the
    biases of the down projections and the output."""
    norms = (self.q_lora_rank or 0) + self.kv_lora_rank
    biases = 0
    if self.attention_bias:
      biases = (self.q_lora_rank or 0) + self.kv_lora_rank + self.qk_rope_head_dim + self.dim
    return self._attention_matrices() + norms + biases

  @nn.nowrap
  def attention_matmul_parameters(self) -> int:
    return self._attention_matrices()

  @nn.nowrap
  def attention_head_widths(self) -> int:
    return self.resolved_head_dim + self.v_head_dim

  @nn.nowrap
  def decode_attention_flops(self, context_length: int) -> int:
    """The absorbed step: each head's scores over kv_lora_rank + qk_rope_head_dim and its
    weighted sum of latents, per cached position (the absorbed up projections are the
    weight matmuls' count already: kv_b once per token either way)."""
    per_position = 2 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
    return self.num_layers * per_position * context_length

  @nn.nowrap
  def size_fields(self) -> dict[str, int]:
    sizes = dict(super().size_fields(), kv_lora_rank=self.kv_lora_rank,
                 v_head_dim=self.v_head_dim, qk_nope_head_dim=self.qk_nope_head_dim)
    if self.q_lora_rank:
      sizes["q_lora_rank"] = self.q_lora_rank
    return sizes

  # ---------------------------------------------------------------------------- cache

  @nn.nowrap
  def cache_widths(self) -> tuple[int, int, int]:
    """One "head" of the latent (the keys' arrays) and the rotary key (the values')."""
    return 1, self.kv_lora_rank, self.qk_rope_head_dim

  @nn.nowrap
  def cache_layout(self) -> str:
    """Its own ("latent": one latent and rotary key per entry, decoded by the `latent` row
    whatever the kernel), stored as one "head"."""
    return LAYOUT

  @nn.nowrap
  def cache_axes(self) -> tuple[str | None, ...]:
    return ("batch", None, "length", None)

  # ---------------------------------------------------------------------------- checks

  @nn.nowrap
  def validate(self, target: Any, path: str = "model") -> None:
    for name in _DERIVED:
      if getattr(self, name) is not None:
        raise config_error(f"{path}.{name}", getattr(self, name),
                           "is derived by latent attention", "leave it None (set "
                           "qk_nope_head_dim, qk_rope_head_dim and v_head_dim)")
    if self.qk_rope_head_dim % 2:
      raise config_error(f"{path}.qk_rope_head_dim", self.qk_rope_head_dim,
                         "must be even: rotary features turn in pairs", "use an even width")
    if set(self.layer_kinds[:self.num_layers]) != {"full"}:
      raise config_error(f"{path}.layer_kinds", self.layer_kinds,
                         "latent attention attends to the whole context", "use ('full',)")
    for name, allowed in (("qk_norm", "none"), ("position", "rotary"),
                          ("block", "sequential")):
      if getattr(self, name) != allowed:
        raise config_error(f"{path}.{name}", getattr(self, name),
                           "is not a choice of latent attention's blocks", f"use {allowed!r}")
    super().validate(target, path)

  @classmethod
  def tiny(cls, fields: Mapping[str, Any], sequence_length: int) -> dict[str, Any]:
    """`TransformerLM.tiny`'s with the latent sizes shrunk (a bottleneck of 24 where the
    model has one, a latent of 32, heads of 16 + 8 and values of 16)."""
    changes = super().tiny(fields, sequence_length)
    changes.update(head_dim=None, num_kv_heads=None, kv_lora_rank=32, qk_nope_head_dim=16,
                   qk_rope_head_dim=8, v_head_dim=16)
    changes.pop("rotary_dim", None)
    if fields.get("q_lora_rank", cls.q_lora_rank) is not None:
      changes["q_lora_rank"] = 24
    return changes
