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

(The MLP's output needs no name: the backward pass never reads it, only the block's output it
is added into, which the next block keeps as its input.)

A policy names what is kept (on the device, or moved to the host's memory and brought back
for the backward pass: `*_offloaded`, TPUs and GPUs only); everything else is recomputed.
Keeping `attention_out` spares the backward pass a second attention forward; keeping the
projections spares their matmuls. The compile program's table (`--mode=compile`) shows, per
policy, the largest batch that fits a target, so a user picks from measured rows rather than
from this list.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import jax
from jax.ad_checkpoint import checkpoint_name

RematPolicy = Literal[
    "none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "minimal",
    "save_qkv_proj", "save_attention", "save_dot_except_mlp", "save_dot_except_mlp_in",
    "qkv_proj_offloaded", "minimal_offloaded"]

NAMES = ("query_proj", "key_proj", "value_proj", "attention_out", "out_proj", "mlp_in")
_QKV = ("query_proj", "key_proj", "value_proj")
_ATTENTION = (*_QKV, "attention_out", "out_proj")

# Policy name -> (names kept on the device, names moved to the host), for the named policies.
_NAMED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # Every weight matmul's output: the backward recomputes attention and the elementwise
    # work only (as dots_with_no_batch_dims_saveable, but by name, so a kernel's output is not
    # mistaken for a weight matmul's).
    "minimal": ((*_QKV, "out_proj", "mlp_in"), ()),
    "save_qkv_proj": (_QKV, ()),
    # The projections and the attention's output: no attention recomputed; the MLP is.
    "save_attention": ((*_QKV, "attention_out"), ()),
    "save_dot_except_mlp": (_ATTENTION, ()),
    "qkv_proj_offloaded": ((), _QKV),
    "minimal_offloaded": ((), (*_QKV, "out_proj", "mlp_in")),
}

DESCRIPTIONS = {
    "none": "keep everything (no recomputation)",
    "full": "keep nothing: recompute each block",
    "dots_saveable": "keep every matmul's output (attention scores too)",
    "dots_with_no_batch_dims_saveable": "keep the weight matmuls' outputs",
    "minimal": "keep the q/k/v, output and MLP projections (by name)",
    "save_qkv_proj": "keep the q/k/v projections",
    "save_attention": "keep the q/k/v projections and the attention's output",
    "save_dot_except_mlp": "keep the attention's projections and output, recompute the MLP",
    "qkv_proj_offloaded": "move the q/k/v projections to host memory",
    "minimal_offloaded": "move minimal's activations to host memory",
}

POLICIES = tuple(DESCRIPTIONS)


def tag(x: jax.Array, name: str) -> jax.Array:
  """Names an activation for the remat policies (identity otherwise)."""
  return checkpoint_name(x, name)


def offloads(policy: str) -> bool:
  """Whether the policy moves activations to the host's memory."""
  return bool(_NAMED.get(policy, ((), ()))[1])


def policy_function(policy: str) -> Callable[..., Any] | None:
  """The `jax.checkpoint` policy for a name; None for "none" (no remat at all)."""
  if policy == "none":
    return None
  generic = {"full": jax.checkpoint_policies.nothing_saveable,
             "dots_saveable": jax.checkpoint_policies.dots_saveable,
             "dots_with_no_batch_dims_saveable":
                 jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
  if policy in generic:
    return generic[policy]
  kept, moved = _NAMED[policy]
  if not moved:
    return jax.checkpoint_policies.save_only_these_names(*kept)
  return jax.checkpoint_policies.save_and_offload_only_these_names(
      names_which_can_be_saved=list(kept), names_which_can_be_offloaded=list(moved),
      offload_src="device", offload_dst="pinned_host")
