"""Remat policies: what the backward pass keeps from each block's forward, by name.

Rematerialization trades compute for memory: a block's forward activations are either kept
in memory until its backward pass needs them, or recomputed there from the block's input.
The blocks tag the activations worth keeping with `tag` (`jax.ad_checkpoint.checkpoint_name`):

| name          | what it is                                          | per token and layer |
|---------------|-----------------------------------------------------|---------------------|
| query_proj    | the query projection (before rotary)                | heads x head_dim    |
| key_proj      | the key projection                                  | kv_heads x head_dim |
| value_proj    | the value projection                                | kv_heads x head_dim |
| attention_out | the attention's output (and splash's log-sum-exp)   | heads x head_dim    |
| out_proj      | the attention's output projection                   | dim                 |
| mlp_in        | the MLP's input projections (value and gate)        | 1-2 x mlp_dim       |
| mlp_out       | the MLP's output (its output projection; a mixture  | dim                 |
|               | of experts' combined output)                        |                     |

The backward pass reads `mlp_out` only where a norm follows the MLP (the "sandwich" and
"post_norm" blocks: Gemma 3, OLMo 3); elsewhere it is only added into the block's output, which
the next block keeps as its input, so a policy naming it keeps nothing more there.

A policy names what is kept (on the device, or moved to the host's memory and brought back
for the backward pass: `*_offloaded`, TPUs and GPUs only); everything else is recomputed.
Keeping `attention_out` spares the backward pass a second attention forward; keeping the
projections spares their matmuls. `POLICIES` is the one table of them: the field's accepted
names (`RematPolicy`), the descriptions, and what each does all come from it, so a name cannot
be accepted that nothing implements. The compile program's table (`--mode=compile`) shows, per
policy, the largest batch that fits a target, so a user picks from measured rows rather than
from this list.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal

import jax
from jax.ad_checkpoint import checkpoint_name

NAMES = ("query_proj", "key_proj", "value_proj", "attention_out", "out_proj", "mlp_in",
         "mlp_out")
_QKV = ("query_proj", "key_proj", "value_proj")
_ATTENTION = (*_QKV, "attention_out", "out_proj")


@dataclasses.dataclass(frozen=True)
class Policy:
  """One remat policy: what it keeps, in words and as what `jax.checkpoint` is given.

  Attributes:
    description: One line for the compile report and the help.
    kept: Names (`NAMES`) kept on the device.
    offloaded: Names moved to the host's memory and brought back for the backward pass.
    jax_policy: One of JAX's own policies instead of names (`jax.checkpoint_policies`).
    remat: False for "none": the blocks are not wrapped in `jax.checkpoint` at all.
  """

  description: str
  kept: tuple[str, ...] = ()
  offloaded: tuple[str, ...] = ()
  jax_policy: Callable[..., Any] | None = None
  remat: bool = True


_POLICIES = jax.checkpoint_policies
# Policy name -> what it does: the one table (the field's choices are its keys).
POLICIES: dict[str, Policy] = {
    "none": Policy("keep everything (no recomputation)", remat=False),
    "full": Policy("keep nothing: recompute each block", jax_policy=_POLICIES.nothing_saveable),
    "dots_saveable": Policy("keep every matmul's output (attention scores too)",
                            jax_policy=_POLICIES.dots_saveable),
    "dots_with_no_batch_dims_saveable": Policy(
        "keep the weight matmuls' outputs",
        jax_policy=_POLICIES.dots_with_no_batch_dims_saveable),
    # Every weight matmul's output but the MLP's (needed by the backward only after a norm):
    # the backward recomputes attention and the elementwise work only (as
    # dots_with_no_batch_dims_saveable, but by name, so a kernel's output is not mistaken for
    # a weight matmul's).
    "minimal": Policy("keep the q/k/v, output and MLP projections (by name)",
                      kept=(*_QKV, "out_proj", "mlp_in")),
    # MaxText's minimal_with_context: minimal's and the attention's output, so the backward
    # runs no attention forward again (a splash forward was 10% of a Llama1BOneChip step under
    # `minimal`, bench/tpu_profile.py), for [tokens, heads x head_dim] more a layer.
    "minimal_with_context": Policy("keep minimal's projections and the attention's output",
                                   kept=(*_QKV, "attention_out", "out_proj", "mlp_in")),
    "save_qkv_proj": Policy("keep the q/k/v projections", kept=_QKV),
    # The projections and the attention's output: no attention recomputed; the MLP is.
    "save_attention": Policy("keep the q/k/v projections and the attention's output",
                             kept=(*_QKV, "attention_out")),
    "save_dot_except_mlp": Policy("keep the attention's projections and output, recompute "
                                  "the MLP", kept=_ATTENTION),
    # MaxText's save_dot_except_mlpwi: every weight matmul's output but the MLP's input
    # projections, the widest (1-2 x mlp_dim per token), which the backward recomputes.
    "save_dot_except_mlp_in": Policy("keep the attention's projections and the MLP's output, "
                                     "recompute the MLP's input projections",
                                     kept=(*_QKV, "out_proj", "mlp_out")),
    "qkv_proj_offloaded": Policy("move the q/k/v projections to host memory", offloaded=_QKV),
    "minimal_offloaded": Policy("move minimal's activations to host memory",
                                offloaded=(*_QKV, "out_proj", "mlp_in")),
}

# The field's type: exactly the table's names, so the two cannot drift apart.
RematPolicy = Literal[tuple(POLICIES)]  # type: ignore[valid-type]



def tag(x: jax.Array, name: str) -> jax.Array:
  """Names an activation for the remat policies (identity otherwise)."""
  return checkpoint_name(x, name)


def offloads(policy: str) -> bool:
  """Whether the policy moves activations to the host's memory."""
  return bool(POLICIES[policy].offloaded)


def policy_function(policy: str) -> Callable[..., Any] | None:
  """The `jax.checkpoint` policy for a name; None for "none" (no remat at all)."""
  chosen = POLICIES[policy]
  if not chosen.remat:
    return None
  if chosen.jax_policy is not None:
    return chosen.jax_policy
  if not chosen.offloaded:
    return jax.checkpoint_policies.save_only_these_names(*chosen.kept)
  return jax.checkpoint_policies.save_and_offload_only_these_names(
      names_which_can_be_saved=list(chosen.kept),
      names_which_can_be_offloaded=list(chosen.offloaded),
      offload_src="device", offload_dst="pinned_host")
