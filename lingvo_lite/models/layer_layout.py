"""Converting parameter trees between unrolled layers (`layer_0`, `layer_1`, ...) and one
scanned `layers` subtree whose arrays have a leading layer axis.

Scanned layers of one attention kind are `layers/...` with a leading axis of num_layers.
Scanned layers of a repeating pattern of P kinds (models/transformer_layers.py) are
`layers/pattern_j/...` with a leading axis of groups (layer g * P + j at index g), and the
layers past the last whole group stay unrolled (`layer_N`). A prefix of S layers that breaks
the period (DeepSeek's dense first layers) stays unrolled too, `layer_0..layer_{S-1}`, and
the scanned rows count from layer S (layer S + g * P + j at index g): the first layer that is
neither unrolled nor stacked is where the scan starts, so unstacking needs no model.

`flatten` and `unflatten` give a tree as its leaves by "/"-joined path and back.

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
_PATTERN_KEY = re.compile(r"pattern_(\d+)$")


def _is_unrolled(node: Any) -> bool:
  return isinstance(node, dict) and "layer_0" in node


def _is_scanned(node: Any) -> bool:
  return isinstance(node, dict) and isinstance(node.get("layers"), dict)


def stack_layers(tree: Any, period: int = 1, scanned: int | None = None,
                 start: int = 0) -> Any:
  """Every dict with keys layer_0..layer_{n-1} -> the same dict with one stacked `layers`:
  the n - `start` layers from `start` on (`period` 1), or the `scanned` layers from `start`
  on in groups of `period` (`layers/pattern_j`), the others left as they are."""
  def convert(node):
    if not _is_unrolled(node) or "layers" in node:  # Stacked already (an unrolled prefix).
      return node
    indices = sorted(int(m.group(1)) for m in map(_LAYER_KEY.match, node) if m)
    if indices != list(range(len(indices))):
      raise ValueError(f"layer keys are not layer_0..layer_{len(indices) - 1}: {indices}")
    count = len(indices) - start if scanned is None else scanned
    if count <= 0:  # Nothing scanned: the layers stay as they are.
      return node
    rest = {k: v for k, v in node.items() if not _LAYER_KEY.match(k)}
    rest.update({f"layer_{i}": node[f"layer_{i}"]
                 for i in indices[:start] + indices[start + count:]})

    def stacked(layers):
      return jax.tree.map(lambda *xs: np.stack(xs), *[node[f"layer_{i}"] for i in layers])

    if period == 1:
      return {**rest, "layers": stacked(range(start, start + count))}
    return {**rest, "layers": {f"pattern_{j}": stacked(range(start + j, start + count, period))
                               for j in range(period)}}
  return jax.tree.map(convert, tree, is_leaf=_is_unrolled)


def unstack_layers(tree: Any) -> Any:
  """Every dict with a `layers` subtree -> the same dict with layer_0..layer_{n-1}."""
  def convert(node):
    if not _is_scanned(node):
      return node
    scanned = node["layers"]
    members = sorted((int(m.group(1)), key) for key in scanned
                     if (m := _PATTERN_KEY.match(key)))
    groups = [scanned[key] for _, key in members] if members else [scanned]
    rest = {k: v for k, v in node.items() if k != "layers"}
    unrolled = {int(m.group(1)) for m in map(_LAYER_KEY.match, rest) if m}
    start = next(index for index in range(len(unrolled) + 1) if index not in unrolled)
    count = jax.tree.leaves(groups[0])[0].shape[0]
    for group in range(count):
      for member, subtree in enumerate(groups):
        rest[f"layer_{start + group * len(groups) + member}"] = jax.tree.map(
            lambda x, g=group: x[g], subtree)
    return rest
  return jax.tree.map(convert, tree, is_leaf=_is_scanned)


# ------------------------------------------------------------------------------ paths

def flatten(tree: Any) -> dict[str, Any]:
  """A nested dict of arrays (or another mapping) as {"a/b/c": leaf}."""
  out: dict[str, Any] = {}

  def visit(node: Any, prefix: str) -> None:
    if isinstance(node, dict) or hasattr(node, "items") and not hasattr(node, "shape"):
      for key, value in node.items():
        visit(value, f"{prefix}/{key}" if prefix else str(key))
    else:
      out[prefix] = node
  visit(tree, "")
  return out


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
  """The nested dict of `flatten`'s {"a/b/c": leaf}."""
  tree: dict[str, Any] = {}
  for path, leaf in flat.items():
    node = tree
    *parents, last = path.split("/")
    for part in parents:
      node = node.setdefault(part, {})
    node[last] = leaf
  return tree
