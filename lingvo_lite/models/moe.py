"""A mixture-of-experts feed-forward layer: a router that sends each token to k of E experts
(SwiGLU MLPs whose weights are stacked on a leading `experts` axis), and three ways to run
them that compute the same function where nothing is dropped.

The routing and the three dispatches (`dropless`, `capacity`, `dense`) are
models/expert_dispatch.py's; `all_to_all` is `dropless` with the routed rows moved to their
experts' devices under a mesh (models/moe_parallel.py: at most `capacity_factor` times a
device's fair share to each expert shard, the rest dropped; with a factor of at least the
expert ways, or without a mesh, it is `dropless`). This module is the layer: its parameters,
its dispatch by field, and what it sows.

Statistics (sown into the `STATISTICS` collection, which `MoeTransformerLM.
logits_and_losses` reads; nothing is kept when the model is applied without it):

- `load_balance`: Switch's auxiliary loss in Mixtral's form (transformers'
  `load_balancing_loss_func`): E x sum over experts of (the fraction of tokens that chose
  the expert, counting each of a token's k choices) x (the mean router score of the expert).
  Perfect balance makes it k; every token of the batch counts (padding too).
- `router_z`: ST-MoE's router z-loss, the mean over tokens of logsumexp(router logits)^2.
- `expert_fraction` [E]: each expert's share of the T x k assignments (they sum to 1).
- `router_probability` [E]: each expert's mean router score (the balance loss's second
  factor): with `expert_fraction`, what a pipeline's microbatches average into the batch's
  balance loss exactly (both are means over the tokens; the loss, their product, is not).
- `dropped`: the fraction of assignments dropped (0 but under "capacity" and "all_to_all").
- With `selection_bias` only: `expert_load` [E], each expert's assignments (counts, for the
  bias's update after the step: models/expert_balance.py), and `selection_bias` [E], the
  bias as it chose (logged).

Shared experts (DeepSeek, Qwen2-MoE): `shared_mlp_dim` > 0 adds one SwiGLU MLP of that width
that every token goes through (several shared experts are one MLP of their summed width).

DeepSeek's routing (expert_dispatch.route): `expert_groups` of which a token's experts come
from its best `groups_per_token`, `routed_scaling`, and `selection_bias`: a float32 parameter
`selection_bias` [experts] (Hugging Face's `e_score_correction_bias`) added to the scores to
choose the experts, never to weigh them; it gets no gradient (a train step moves it by the
step's loads instead).

Parameters: `router_kernel` [embed, experts] (and `router_bias`),
`wi` (the activated projection, Hugging Face's gate_proj / w1), `wi_gate` (the multiplied one,
up_proj / w3), `wo` (down_proj / w2), stacked [experts, ...], with biases of the same names
plus `_bias` under `expert_bias`.

Meshes: under a mesh of more than one device the dropless path runs per shard
(models/moe_parallel.py: each device sorts its own tokens; experts split over the `expert` mesh
axis see the tokens of their group); the capacity and dense paths are einsums the compiler
partitions (GShard's form).
"""

from __future__ import annotations

from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.models import layers, moe_parallel, remat
from lingvo_lite.models.expert_dispatch import (ExpertActivation, ExpertGroups, ExpertWeights,
                                                GroupScore, Routing, RouterScore,
                                                capacity_dispatch, dense_reference,
                                                dense_weight, expert_counts, load_balance_loss,
                                                mean_probabilities,
                                                route, router_z_loss)
from lingvo_lite.models.quantization import Quantization

Dispatch = Literal["dropless", "all_to_all", "capacity", "dense"]

# The collection a layer's routing statistics are sown into.
STATISTICS = "statistics"


class MoeMlp(nn.Module):
  """The mixture-of-experts feed-forward layer (the module doc): x [B, L, D] -> [B, L, D].

  Attributes:
    num_experts: E, the routed experts.
    experts_per_token: k, the experts each token goes to.
    mlp_dim: Each expert's hidden width.
    dispatch: "dropless", "all_to_all", "capacity" or "dense" (the module doc).
    capacity_factor: Under "capacity": each expert's slots per row over its fair share
      (length x k / E); under "all_to_all": the rows a device sends each expert shard over
      its fair share (T x k / ways).
    router_score: "softmax" or "sigmoid".
    renormalize: Divide the chosen k scores by their sum.
    router_bias: A learned bias on the router logits (gpt-oss).
    expert_bias: Biases on the experts' projections (gpt-oss).
    activation: "swiglu" or "clamped_swiglu" (gpt-oss), with `swiglu_alpha`, `swiglu_limit`.
    shared_mlp_dim: The width of the shared experts' MLP every token goes through; 0: none.
    expert_groups: The groups the experts are in (DeepSeek's n_group; 1: no groups).
    groups_per_token: The groups a token's experts come from (topk_group; None: all).
    group_score: How a group scores for a token: "max" (DeepSeek-V2) or "top2_sum" (V3).
    routed_scaling: The routed experts' weights are multiplied by it (routed_scaling_factor).
    selection_bias: A per-expert bias on the scores for choosing only (the module doc).
    quantization: The model's (models/quantization.py): an int8 expert weight is multiplied
      dequantized; the router always in float32.
  """

  num_experts: int
  experts_per_token: int
  mlp_dim: int
  dispatch: Dispatch = "dropless"
  capacity_factor: float = 1.25
  router_score: RouterScore = "softmax"
  renormalize: bool = True
  router_bias: bool = False
  expert_bias: bool = False
  activation: ExpertActivation = "swiglu"
  swiglu_alpha: float = 1.702
  swiglu_limit: float = 7.0
  shared_mlp_dim: int = 0
  expert_groups: int = 1
  groups_per_token: int | None = None
  group_score: GroupScore = "max"
  routed_scaling: float = 1.0
  selection_bias: bool = False
  quantization: Quantization | None = None
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  def _stacked(self, name: str, shape: tuple[int, ...], axes: tuple[str, ...],
               fan_in: int) -> Any:
    return self.param(name, layers.dense_init(axes, fan_in), shape, self.param_dtype)

  def _bias(self, name: str, shape: tuple[int, ...], axes: tuple[str, ...]) -> jax.Array:
    init = nn.with_logical_partitioning(nn.initializers.zeros, axes)
    return self.param(name, init, shape, self.param_dtype)

  def expert_weights(self, dim: int) -> ExpertWeights:
    """The stacked experts' parameters (created on first use)."""
    experts, hidden = self.num_experts, self.mlp_dim
    wi = self._stacked("wi", (experts, dim, hidden), ("experts", "embed", "mlp"), dim)
    wi_gate = self._stacked("wi_gate", (experts, dim, hidden), ("experts", "embed", "mlp"), dim)
    wo = self._stacked("wo", (experts, hidden, dim), ("experts", "mlp", "embed"), hidden)
    biases = (None, None, None)
    if self.expert_bias:
      biases = (self._bias("wi_bias", (experts, hidden), ("experts", "mlp")),
                self._bias("wi_gate_bias", (experts, hidden), ("experts", "mlp")),
                self._bias("wo_bias", (experts, dim), ("experts", "embed")))
    dtype = self.dtype
    quantization = self.quantization
    return ExpertWeights(dense_weight(wi, dtype, quantization),
                         dense_weight(wi_gate, dtype, quantization),
                         dense_weight(wo, dtype, quantization),
                         *(None if b is None else b.astype(dtype) for b in biases))

  def router_logits(self, x: jax.Array) -> jax.Array:
    """float32 [..., E]: the router's logits (float32 whatever the compute dtype or the
    quantization: a rounded router moves tokens between experts)."""
    dim = x.shape[-1]
    kernel = self._stacked("router_kernel", (dim, self.num_experts), ("embed", "experts"), dim)
    logits = jnp.einsum("...d,de->...e", x.astype(jnp.float32),
                        jnp.asarray(kernel, jnp.float32))
    if self.router_bias:
      logits = logits + self._bias("router_bias", (self.num_experts,),
                                   ("experts",)).astype(jnp.float32)
    return logits

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    batch, length, dim = x.shape
    x = x.astype(self.dtype)
    logits = self.router_logits(x).reshape(batch * length, self.num_experts)
    bias = None
    if self.selection_bias:
      # float32 whatever param_dtype: a bfloat16 bias of 0.5 does not move by a 1e-3 step.
      bias = self.param("selection_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("experts",)), (self.num_experts,), jnp.float32)
    groups = ExpertGroups(self.expert_groups, self.groups_per_token or self.expert_groups,
                          self.group_score)
    routing = route(logits, self.experts_per_token, self.router_score, self.renormalize,
                    groups, bias, self.routed_scaling)
    weights = self.expert_weights(dim)
    settings = (self.activation, self.swiglu_alpha, self.swiglu_limit)
    dropped = jnp.zeros((), jnp.float32)
    if self.dispatch == "capacity":
      y, dropped = capacity_dispatch(x, routing, weights, self.capacity_factor, *settings)
    elif self.dispatch == "all_to_all":
      y, dropped = moe_parallel.all_to_all(x, routing, weights, self.capacity_factor, *settings)
    elif self.dispatch == "dense":
      y = dense_reference(x.reshape(-1, dim), routing, weights, *settings)
    else:
      y = moe_parallel.dropless(x, routing, weights, *settings)
    y = y.reshape(batch, length, dim)
    if self.shared_mlp_dim:
      y = y + layers.Mlp(mlp_dim=self.shared_mlp_dim, activation="swiglu", use_bias=False,
                         quantization=self.quantization, dtype=self.dtype,
                         param_dtype=self.param_dtype, name="shared")(x)
    self._sow_statistics(routing, dropped, bias)
    # The layer's output, as a dense MLP's (models/remat.py's "mlp_out").
    return remat.tag(layers.constrain(y, "batch", "length", "embed"), "mlp_out")

  def _sow_statistics(self, routing: Routing, dropped: jax.Array,
                      bias: jax.Array | None) -> None:
    if not self.is_mutable_collection(STATISTICS):
      return
    counts = expert_counts(routing.experts, self.num_experts)
    balance = load_balance_loss(routing, self.router_score)
    sown = [("load_balance", balance), ("router_z", router_z_loss(routing.logits)),
            ("expert_fraction", counts / jnp.sum(counts)), ("dropped", dropped),
            ("router_probability", mean_probabilities(routing, self.router_score))]
    if bias is not None:
      sown += [("expert_load", counts), ("selection_bias", jax.lax.stop_gradient(bias))]
    for name, value in sown:
      self.sow(STATISTICS, name, value)

