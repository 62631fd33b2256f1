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
- DeepSeek (models/expert_dispatch.py, expert_balance.py): `expert_groups` limited to
  `expert_groups_per_token` per token (scored by `group_score`), `routed_scaling_factor`,
  shared experts (`shared_expert_mlp_dim`: DeepSeek's n_shared_experts x
  moe_intermediate_size), the first `first_dense_layers` layers dense (DeepSeek's
  first_k_dense_replace: a dense MLP of `mlp_dim`), and `selection_bias`: the auxiliary-loss-
  free balance, each MoE layer's bias moved after every train step by
  `selection_bias_rate` x sign(mean load - load) (`after_step`). It logs `moe_load_cv` (the
  coefficient of variation of the experts' loads, averaged over the layers) and
  `moe_selection_bias_spread` (the bias's max - min, averaged over the layers).
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
from lingvo_lite.models import expert_balance, expert_dispatch, moe
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
    dispatch: "dropless" (grouped matmuls over tokens sorted by expert), "all_to_all"
      (dropless with the routed rows moved to their experts' devices, at most
      `capacity_factor` x a device's fair share to each; the rest dropped), "capacity" (a
      fixed number of slots per expert and row; the rest dropped) or "dense" (every expert on
      every token: the reference); models/moe.py.
    capacity_factor: Under "capacity": each expert's slots per row over its fair share;
      under "all_to_all": each expert shard's rows from a device over its fair share.
    router_score: "softmax" or "sigmoid" scores of the router logits.
    renormalize_top_k: Divide the chosen k scores by their sum.
    router_bias: A learned bias on the router logits.
    expert_bias: Biases on the experts' projections.
    expert_activation: "swiglu", or gpt-oss's "clamped_swiglu" (`swiglu_alpha`,
      `swiglu_limit`).
    shared_expert_mlp_dim: The width of shared experts every token goes through (0: none).
    expert_groups: The groups the experts are in (n_group); 1: no groups.
    expert_groups_per_token: The groups a token's experts come from (topk_group); None: all.
    group_score: How a group scores for a token: "max" (DeepSeek-V2's best expert) or
      "top2_sum" (DeepSeek-V3's two best biased scores).
    routed_scaling_factor: The routed experts' weights are multiplied by it.
    selection_bias: A per-expert bias on the scores for choosing the experts only, moved
      after each train step against the experts' load (models/expert_balance.py).
    selection_bias_rate: The bias's step per train step (the paper's update speed gamma);
      0: the bias stays as loaded (a fine-tune).
    first_dense_layers: The first layers are dense whatever `mlp_kinds` says
      (first_k_dense_replace); the others follow `mlp_kinds`. Scanned, the dense layers run
      unrolled before the scan of the others (`scan_prefix`).
    multi_token_layers: D, DeepSeek-V3's multi-token prediction modules (num_nextn_predict_
      layers; models/multi_token.py), each a block of the last layer's kinds predicting one
      token further ahead; trained by training/objectives/multi_token.py, ignored in decoding.
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
  expert_groups: PositiveInt = 1
  expert_groups_per_token: PositiveInt | None = None
  group_score: expert_dispatch.GroupScore = "max"
  routed_scaling_factor: PositiveFloat = 1.0
  selection_bias: bool = False
  selection_bias_rate: Annotated[NonNegativeFloat, TRAINING] = 0.001
  first_dense_layers: NonNegativeInt = 0
  multi_token_layers: NonNegativeInt = 0
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
    """`mlp_kinds`, or "dense" where `first_dense_layers` makes every layer dense."""
    if self.first_dense_layers >= self.num_layers:
      return ("dense",)
    return tuple(self.mlp_kinds)

  @nn.nowrap
  def mlp_kinds_by_layer(self) -> tuple[str, ...]:
    kinds = per_layer(self.mlp_kinds, self.num_layers)
    first = min(self.first_dense_layers, self.num_layers)
    return ("dense",) * first + kinds[first:]

  @nn.nowrap
  def scan_prefix(self) -> int:
    """The dense first layers where they break the patterns' period (a layer among them
    that `mlp_kinds` makes MoE), unrolled before the scan of the others; else none. A
    stack of dense layers then MoE layers has no shorter period than its depth: scanned
    whole, it would be one group of every layer (nothing scanned)."""
    first = min(self.first_dense_layers, self.num_layers)
    if first == self.num_layers or not count_per_layer(self.mlp_kinds, first, "moe"):
      return 0
    return first

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
        "shared_mlp_dim": self.shared_expert_mlp_dim, "expert_groups": self.expert_groups,
        "groups_per_token": self.expert_groups_per_token, "group_score": self.group_score,
        "routed_scaling": self.routed_scaling_factor, "selection_bias": self.selection_bias}

  @nn.nowrap
  def moe_layers(self) -> int:
    first = min(self.first_dense_layers, self.num_layers)
    return (count_per_layer(self.mlp_kinds, self.num_layers, "moe")
            - count_per_layer(self.mlp_kinds, first, "moe"))

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
            + biases + shared + (experts if self.selection_bias else 0))

  @nn.nowrap
  def multi_token_depth(self) -> int:
    return self.multi_token_layers

  @nn.nowrap
  def num_parameters(self) -> int:
    moe_layers = self.moe_layers()
    return (super().num_parameters() + self._multi_token_parameters()
            + moe_layers * (self._moe_parameters(False) - self._dense_mlp_parameters()))

  @nn.nowrap
  def _multi_token_parameters(self) -> int:
    """The multi-token modules': each a block of the last layer's kinds (one layer's
    parameters, counted as the difference of two stacks), the projection and three norms."""
    if not self.multi_token_layers:
      return 0
    last = self.clone(parent=None, first_dense_layers=0, multi_token_layers=0,
                      mlp_kinds=(self.mlp_kinds_by_layer()[-1],),
                      layer_kinds=(self.kinds_by_layer()[-1],))
    block = (last.clone(parent=None, num_layers=2).num_parameters()
             - last.clone(parent=None, num_layers=1).num_parameters())
    norm = 2 * self.dim if self.norm == "layernorm" else self.dim
    return self.multi_token_layers * (block + 2 * self.dim * self.dim + 3 * norm)

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
    self._check_groups(path)

  @nn.nowrap
  def _check_groups(self, path: str) -> None:
    """Refuses groups of experts that do not split the experts evenly, more groups per token
    than groups, or too few experts in a token's groups for its k."""
    groups, chosen = self.expert_groups, self.expert_groups_per_token or self.expert_groups
    if self.num_experts % groups:
      raise config_error(f"{path}.expert_groups", groups, f"does not divide "
                         f"{path}.num_experts={self.num_experts} into equal groups",
                         "give a divisor of num_experts (1: no groups)")
    if chosen > groups:
      raise config_error(f"{path}.expert_groups_per_token", chosen, f"is more than "
                         f"{path}.expert_groups={groups}", "choose at most every group")
    reachable = chosen * (self.num_experts // groups)
    if self.experts_per_token > reachable:
      raise config_error(f"{path}.experts_per_token", self.experts_per_token,
                         f"is more than the {reachable} experts of {chosen} of "
                         f"{path}.expert_groups={groups} groups a token chooses from",
                         "raise expert_groups_per_token or lower experts_per_token")

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
    if fields.get("first_dense_layers"):  # One dense layer, then the MoE layers.
      changes.update(first_dense_layers=1, num_layers=max(changes["num_layers"], 2))
    if fields.get("multi_token_layers"):
      changes["multi_token_layers"] = 1
    if fields.get("expert_groups", 1) > 1:  # 2 groups, a token's experts from 1 if they hold k.
      experts, k = changes["num_experts"], changes["experts_per_token"]
      groups = 2 if experts % 2 == 0 else 1
      changes.update(expert_groups=groups,
                     expert_groups_per_token=1 if experts // groups >= k else groups)
    return changes

  # ---------------------------------------------------------------------------- objective

  @nn.nowrap
  def auxiliary_and_statistics(self, sown: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The routers' balance and z-losses, weighted by their coefficients, and the routing's
    statistics by name (each layer's sown rows averaged)."""
    collection = sown.get(moe.STATISTICS, {})
    sown = layer_statistics(collection)
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
    if expert_balance.BIAS in sown:  # Rows of the layers with a selection bias.
      loads = sown[expert_balance.LOAD]
      statistics.update(moe_load_cv=jnp.mean(
          jnp.std(loads, axis=-1) / jnp.maximum(jnp.mean(loads, axis=-1), 1e-9)),
          moe_selection_bias_spread=jnp.mean(jnp.ptp(sown[expert_balance.BIAS], axis=-1)))
      statistics[expert_balance.LOADS] = expert_balance.loads_of(collection)
    return auxiliary, statistics

  @nn.nowrap
  def after_step(self, before: Any, params: Any, loads: Any) -> Any:
    """Each selection bias its value before the step moved by its layer's load
    (models/expert_balance.py); a rate of 0 keeps it."""
    if not self.selection_bias:
      return params
    return expert_balance.with_updated_biases(before, params, loads, self.selection_bias_rate)


# The statistics sown with a value per expert.
_PER_EXPERT = ("expert_fraction", "router_probability", expert_balance.LOAD, expert_balance.BIAS)


def layer_statistics(tree: Any) -> dict[str, jax.Array]:
  """Each statistic the MoE layers sowed (moe.py), one row per layer: [layers] for a scalar,
  [layers, E] for the values per expert (scanned layers sow a stacked row per member)."""
  found: dict[str, list[jax.Array]] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = next(key.key for key in reversed(path) if isinstance(key, jax.tree_util.DictKey))
    found.setdefault(name, []).append(leaf)
  rows = {}
  for name, leaves in found.items():
    width = leaves[0].shape[-1:] if name in _PER_EXPERT else ()
    rows[name] = jnp.concatenate([leaf.reshape(-1, *width) for leaf in leaves])
  return rows
