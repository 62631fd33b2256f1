"""The shared transformer with mixture-of-experts feed-forward layers: what every MoE family
(models/mixtral.py, qwen3_moe.py, gpt_oss.py) adds to `TransformerLM`, once.

Each layer's feed-forward kind (`mlp_kinds`, a pattern repeated over the layers as
`layer_kinds` is) is "moe" (models/moe.py's `MoeMlp`: a router, E stacked SwiGLU experts,
the dispatch of `dispatch`) or "dense" (the shared MLP of `mlp_dim`: Qwen3-MoE's
`mlp_only_layers`). A scanned stack steps over a period of (attention kind, feed-forward
kind) pairs (models/transformer_layers.py).

What the family interface asks, answered for experts:

- Sizes: every expert's weights count as parameters (`num_parameters`, `parameter_shapes`:
  the memory they take); `matmul_parameters` counts the weights a token multiplies, the
  active ones: the router, k of the E experts, the shared experts, the attention and the
  output. MFU and the compile report's FLOPs are 6 x that x tokens (plus attention): the
  experts a token does not go to are not its FLOPs, and neither are the capacity path's
  one-hot dispatch einsums nor the dense reference's E - k extra experts (model FLOPs, not
  the hardware's).
- Axes: the `experts` logical axis (sized by `num_experts`), which the default rules split
  over the `expert` mesh axis; each expert's hidden width is `mlp`'s.
- The objective: `logits_and_losses` reads every MoE layer's statistics (moe.py) and adds
  `load_balance_coefficient` x the mean load-balancing loss over the layers plus
  `router_z_loss_coefficient` x the mean router z-loss to the training objective; it logs
  both (`moe_load_balance`, `moe_router_z`), the fraction of assignments dropped
  (`moe_dropped`), and each expert's share of the assignments, averaged over the layers
  (`expert_fraction/NNN`: the run report's heat map).
- int8: the router is never quantized. Under "int8_weights" the stacked experts are int8
  with a scale per expert and output channel, multiplied dequantized; under "int8" training
  the attention's and dense layers' matmuls run in int8, the experts' grouped matmuls in the
  compute dtype (no int8 form of `ragged_dot` here).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.errors import config_error
from lingvo_lite.fields import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from lingvo_lite.models import moe
from lingvo_lite.models.transformer import TransformerLM
from lingvo_lite.models.transformer_layers import count_per_layer, per_layer
from lingvo_lite.run_fields import RUN, TRAINING

MlpKind = Literal["dense", "moe"]
# Each expert's share of the assignments is logged under this prefix, one key per expert.
EXPERT_FRACTION = "expert_fraction/"


class MoeTransformerLM(TransformerLM):
  """`TransformerLM` (its fields' docs are there) with mixture-of-experts layers.

  Attributes:
    num_experts: E, the routed experts of each MoE layer.
    experts_per_token: k, the experts each token goes to.
    expert_mlp_dim: Each expert's hidden width; None: `mlp_dim` (the dense layers' width).
    mlp_kinds: Each layer's feed-forward kind, a pattern repeated over the layers: "moe" or
      "dense".
    dispatch: "dropless" (grouped matmuls over tokens sorted by expert), "capacity" (a
      fixed number of slots per expert and row; the rest dropped) or "dense" (every expert on
      every token: the reference); models/moe.py.
    capacity_factor: Under "capacity": each expert's slots per row over its fair share.
    router_score: "softmax" or "sigmoid" scores of the router logits.
    renormalize_top_k: Divide the chosen k scores by their sum.
    router_bias: A learned bias on the router logits.
    expert_bias: Biases on the experts' projections.
    expert_activation: "swiglu", or gpt-oss's "clamped_swiglu" (`swiglu_alpha`,
      `swiglu_limit`).
    shared_expert_mlp_dim: The width of shared experts every token goes through (0: none).
    load_balance_coefficient: The load-balancing loss's weight in the training objective.
    router_z_loss_coefficient: The router z-loss's weight.
  """

  num_experts: PositiveInt = 8
  experts_per_token: PositiveInt = 2
  expert_mlp_dim: PositiveInt | None = None
  mlp_kinds: tuple[MlpKind, ...] = ("moe",)
  dispatch: Annotated[moe.Dispatch, RUN] = "dropless"
  capacity_factor: Annotated[PositiveFloat, RUN] = 1.25
  router_score: moe.RouterScore = "softmax"
  renormalize_top_k: bool = True
  router_bias: bool = False
  expert_bias: bool = False
  expert_activation: moe.ExpertActivation = "swiglu"
  swiglu_alpha: PositiveFloat = 1.702
  swiglu_limit: PositiveFloat = 7.0
  shared_expert_mlp_dim: NonNegativeInt = 0
  load_balance_coefficient: Annotated[NonNegativeFloat, TRAINING] = 0.01
  router_z_loss_coefficient: Annotated[NonNegativeFloat, TRAINING] = 0.0

  # The routers' statistics (models/moe.py), for `auxiliary_and_statistics`.
  sown_collections: ClassVar[tuple[str, ...]] = (moe.STATISTICS,)

  @property
  def resolved_expert_mlp_dim(self) -> int:
    return self.expert_mlp_dim or self.resolved_mlp_dim

  # ---------------------------------------------------------------------------- layers

  @nn.nowrap
  def mlp_kind_pattern(self) -> tuple[str, ...]:
    return tuple(self.mlp_kinds)

  @nn.nowrap
  def variant_fields(self, period: int) -> dict[str, Any]:
    return dict(super().variant_fields(period),
                mlp_kinds=per_layer(self.mlp_kinds, min(period, self.num_layers)))

  @nn.nowrap
  def mlp_module(self, kind: str) -> tuple[Any, dict[str, Any]]:
    if kind != "moe":
      return None, {}
    return moe.MoeMlp, {
        "num_experts": self.num_experts, "experts_per_token": self.experts_per_token,
        "mlp_dim": self.resolved_expert_mlp_dim, "dispatch": self.dispatch,
        "capacity_factor": self.capacity_factor, "router_score": self.router_score,
        "renormalize": self.renormalize_top_k, "router_bias": self.router_bias,
        "expert_bias": self.expert_bias, "activation": self.expert_activation,
        "swiglu_alpha": self.swiglu_alpha, "swiglu_limit": self.swiglu_limit,
        "shared_mlp_dim": self.shared_expert_mlp_dim}

  @nn.nowrap
  def moe_layers(self) -> int:
    return count_per_layer(self.mlp_kinds, self.num_layers, "moe")

  # ---------------------------------------------------------------------------- sizes

  @nn.nowrap
  def _dense_mlp_parameters(self) -> int:
    """One dense layer's MLP parameters (gated: two input projections)."""
    inputs = 2 if self.mlp_activation in ("swiglu", "geglu") else 1
    mlp_dim = self.resolved_mlp_dim
    return (inputs + 1) * self.dim * mlp_dim + (
        inputs * mlp_dim + self.dim if self.mlp_bias else 0)

  @nn.nowrap
  def _moe_parameters(self, active: bool) -> int:
    """One MoE layer's parameters (`active`: the weight matrices one token multiplies)."""
    dim, hidden, experts = self.dim, self.resolved_expert_mlp_dim, self.num_experts
    shared = 3 * dim * self.shared_expert_mlp_dim
    router = dim * experts
    if active:
      return router + self.experts_per_token * 3 * dim * hidden + shared
    biases = experts * (2 * hidden + dim) if self.expert_bias else 0
    return (router + (experts if self.router_bias else 0) + experts * 3 * dim * hidden
            + biases + shared)

  @nn.nowrap
  def num_parameters(self) -> int:
    moe_layers = self.moe_layers()
    return (super().num_parameters()
            + moe_layers * (self._moe_parameters(False) - self._dense_mlp_parameters()))

  @nn.nowrap
  def block_matmul_parameters(self) -> int:
    """The weights a token multiplies in the blocks: k experts of each MoE layer."""
    inputs = 2 if self.mlp_activation in ("swiglu", "geglu") else 1
    dense_mlp = (inputs + 1) * self.dim * self.resolved_mlp_dim
    return super().block_matmul_parameters() + self.moe_layers() * (
        self._moe_parameters(True) - dense_mlp)

  @nn.nowrap
  def size_fields(self) -> dict[str, int]:
    sizes = dict(super().size_fields(), num_experts=self.num_experts)
    if self.expert_mlp_dim is not None:
      sizes["expert_mlp_dim"] = self.expert_mlp_dim
    return sizes

  @classmethod
  def logical_axes(cls) -> dict[str, str]:
    return dict(super().logical_axes(), experts="num_experts")

  @classmethod
  def int8_weight_contractions(cls) -> dict[tuple[str, ...], tuple[str, ...]]:
    """And the stacked experts (a scale per expert and output channel); the router
    [embed, experts] is not one: it stays in float."""
    return {**super().int8_weight_contractions(),
            ("experts", "embed", "mlp"): ("embed",), ("experts", "mlp", "embed"): ("mlp",)}

  # ---------------------------------------------------------------------------- checks

  @nn.nowrap
  def validate(self, target: Any, path: str = "model") -> None:
    if not self.mlp_kinds:  # First: the sizes are counted layer by layer from the kinds.
      raise config_error(f"{path}.mlp_kinds", self.mlp_kinds, "names no feed-forward kind",
                         "give at least one of 'moe', 'dense'")
    super().validate(target, path)
    if self.experts_per_token > self.num_experts:
      raise config_error(f"{path}.experts_per_token", self.experts_per_token,
                         f"is more than {path}.num_experts={self.num_experts}",
                         "route each token to at most every expert")

  @classmethod
  def tiny(cls, fields: Mapping[str, Any], sequence_length: int) -> dict[str, Any]:
    """`TransformerLM.tiny`'s, with 4 experts (2 per token) of width 96 and shared experts
    (where the model has them) of 64; a pattern of feed-forward kinds becomes each once."""
    changes = super().tiny(fields, sequence_length)
    changes.update(num_experts=min(fields.get("num_experts", 8), 4),
                   experts_per_token=min(fields.get("experts_per_token", 2), 2),
                   expert_mlp_dim=96 if fields.get("expert_mlp_dim") is not None else None)
    if fields.get("shared_expert_mlp_dim"):
      changes["shared_expert_mlp_dim"] = 64
    kinds = tuple(dict.fromkeys(fields.get("mlp_kinds") or ("moe",)))
    if len(kinds) > 1:
      changes.update(mlp_kinds=kinds, num_layers=max(changes["num_layers"], len(kinds) + 1))
    return changes

  # ---------------------------------------------------------------------------- objective

  @nn.nowrap
  def auxiliary_and_statistics(self, sown: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The routers' balance and z-losses, weighted by their coefficients, and the routing's
    statistics by name (each layer's sown rows averaged)."""
    sown = layer_statistics(sown.get(moe.STATISTICS, {}))
    if not sown:
      return jnp.zeros((), jnp.float32), {}
    if "router_probability" in sown:
      # Each layer's balance loss from its two factors, means over the tokens: exact where a
      # pipeline's microbatches averaged them (models/pipeline.py), the same number elsewhere.
      sown["load_balance"] = self.num_experts * self.experts_per_token * jnp.sum(
          sown["expert_fraction"] * sown.pop("router_probability"), axis=-1)
    means = {name: jnp.mean(values, axis=0) for name, values in sown.items()}
    auxiliary = (self.load_balance_coefficient * means["load_balance"]
                 + self.router_z_loss_coefficient * means["router_z"])
    statistics = {"moe_load_balance": means["load_balance"],
                  "moe_router_z": means["router_z"], "moe_dropped": means["dropped"]}
    statistics.update({f"{EXPERT_FRACTION}{index:03d}": share
                       for index, share in enumerate(means["expert_fraction"])})
    return auxiliary, statistics


def layer_statistics(tree: Any) -> dict[str, jax.Array]:
  """Each statistic the MoE layers sowed (moe.py), one row per layer: [layers] for a scalar,
  [layers, E] for the expert shares (scanned layers sow a stacked row per member)."""
  found: dict[str, list[jax.Array]] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = next(key.key for key in reversed(path) if isinstance(key, jax.tree_util.DictKey))
    found.setdefault(name, []).append(leaf)
  rows = {}
  for name, leaves in found.items():
    width = leaves[0].shape[-1:] if name in ("expert_fraction", "router_probability") else ()
    rows[name] = jnp.concatenate([leaf.reshape(-1, *width) for leaf in leaves])
  return rows
