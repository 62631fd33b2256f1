"""Converting parameter trees between unrolled layers (`layer_0`, `layer_1`, ...) and one
scanned `layers` subtree whose arrays have a leading axis of num_layers.

Works on any pytree holding such dicts (parameters, Adam's moments inside an optax state,
a whole TrainState), so a checkpoint written with one layout can be restored into the other.
The conversion runs on host (NumPy) arrays: it happens once, at restore, and the caller
places the result into the new layout's shardings.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np

_LAYER_KEY = re.compile(r"layer_(\d+)$")


def _is_unrolled(node: Any) -> bool:
  return isinstance(node, dict) and "layer_0" in node


def _is_scanned(node: Any) -> bool:
  return isinstance(node, dict) and isinstance(node.get("layers"), dict)


def stack_layers(tree: Any) -> Any:
  """Every dict with keys layer_0..layer_{n-1} -> the same dict with one stacked `layers`."""
  def convert(node):
    if not _is_unrolled(node):
      return node
    indices = sorted(int(m.group(1)) for m in map(_LAYER_KEY.match, node) if m)
    if indices != list(range(len(indices))):
      raise ValueError(f"layer keys are not layer_0..layer_{len(indices) - 1}: {indices}")
    layers = [node[f"layer_{i}"] for i in indices]
    rest = {k: v for k, v in node.items() if not _LAYER_KEY.match(k)}
    return {**rest, "layers": jax.tree.map(lambda *xs: np.stack(xs), *layers)}
  return jax.tree.map(convert, tree, is_leaf=_is_unrolled)


def unstack_layers(tree: Any) -> Any:
  """Every dict with a `layers` subtree -> the same dict with layer_0..layer_{n-1}."""
  def convert(node):
    if not _is_scanned(node):
      return node
    leaves = jax.tree.leaves(node["layers"])
    num_layers = leaves[0].shape[0]
    rest = {k: v for k, v in node.items() if k != "layers"}
    for index in range(num_layers):
      rest[f"layer_{index}"] = jax.tree.map(lambda x, i=index: x[i], node["layers"])
    return rest
  return jax.tree.map(convert, tree, is_leaf=_is_scanned)
