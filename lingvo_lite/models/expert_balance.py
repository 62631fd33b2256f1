"""DeepSeek-V3's auxiliary-loss-free load balance: a per-expert bias that chooses experts
(never weighs them), moved after each train step against the step's load.

Each MoE layer with `selection_bias` (models/moe.py) adds its bias b [E] to the router's
scores when it picks a token's experts, and sows how many assignments each expert got in the
step's forward pass (`expert_load`, every token of the batch, summed over micro-batches).
After the optimizer's update the train step moves each layer's bias by the rule of the paper
(DeepSeek-V3, section 2.1.2): b_e += rate x sign(mean load - load_e), an overloaded expert's
bias down and an underloaded one's up by the same step, and an expert at the mean not at all.
The bias is a parameter (so checkpoints, a resume, the weight formats and decoding hold it as
they hold the rest), but not a trained one: its gradient is zero (it enters the choice under
`stop_gradient`), and whatever the optimizer would make of it (weight decay of a scanned
[layers, E] row) is replaced by the rule's value. Decoding and evaluation never update it.

The step's loads reach the train step beside the loss (the model statistic `LOADS`, which
`training/objectives/objective.py`'s `Forward` takes aside for the step): a tree of the sown
counts whose module paths are the biases' own (scanned layers stack both on the layer axis).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

# The model statistic (`logits_and_losses`) that holds the step's loads, a tree; not logged.
LOADS = "expert_loads"
# The sown counts' name, and the bias parameter's, in each MoE layer (models/moe.py).
LOAD = "expert_load"
BIAS = "selection_bias"


def updated_bias(bias: jax.Array, load: jax.Array, rate: float) -> jax.Array:
  """The paper's rule: bias [..., E] + rate x sign(mean load - load), over the last axis."""
  mean = jnp.mean(load.astype(jnp.float32), axis=-1, keepdims=True)
  return (bias + rate * jnp.sign(mean - load.astype(jnp.float32))).astype(bias.dtype)


def loads_of(sown: Any) -> dict[str, Any]:
  """The sown `expert_load` counts of a forward pass's statistics collection, by the module
  path they were sown at ({} where no layer has a selection bias)."""
  flat = traverse_util.flatten_dict(sown) if sown else {}
  return traverse_util.unflatten_dict(
      {path: sum(value) if isinstance(value, tuple) else value
       for path, value in flat.items() if path[-1] == LOAD})


def with_updated_biases(before: Any, params: Any, loads: Any, rate: float) -> Any:
  """`params` (the optimizer's update of `before`) with each layer's selection bias its
  value in `before` moved by its load (`loads_of`'s tree): the optimizer's take on it (a
  weight decay) is dropped."""
  flat_loads = traverse_util.flatten_dict(loads) if loads else {}
  if not flat_loads:
    return params
  flat, flat_before = traverse_util.flatten_dict(params), traverse_util.flatten_dict(before)
  for path, load in flat_loads.items():
    where = path[:-1] + (BIAS,)
    flat[where] = updated_bias(flat_before[where], load, rate)
  return traverse_util.unflatten_dict(flat)
