"""Tensors of another format placed into a model's parameters.

A Hugging Face folder (hf_checkpoint.py) and a GGUF file (gguf_checkpoint.py) both name their
tensors as the family's `HfNames.tensors()` does; `Placer` converts each to the parameters it
holds (`TensorName.to_ours`), casts it to the parameter's dtype and puts it on its devices as soon
as the parameter is whole, after the checks every weight source gets (tensor_checks.py: dtypes,
shapes; the names: `missing`, `warn_unread`).

Before a tensor is read, the names must cover this very model: every parameter has a tensor
(or is one the format has none for: `HfNames.absent()`) and every tensor's parameters exist. A
model whose fields were set apart from its source's (`--fdl.model.output_bias=True` over a
Llama folder) breaks that; it is refused in one line naming the source, the parameter and the
field the format cannot say (`HfNames.unexpressed`), before a byte is read.

The fingerprint of what was loaded hashes each tensor's bytes with `content_crc`.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Callable, Iterator

import jax
import numpy as np

from lingvo_lite.errors import UsageError
from lingvo_lite.models.checkpoint_names import TensorName
from lingvo_lite.weights import tensor_checks

# The fix of a model whose fields are not the source's.
_AS_THE_SOURCE = ("leave the model's fields as the source sets them (drop the --fdl.model "
                  "overrides that change them)")


class Placer:
  """Puts converted tensors into the model's parameter tree, each leaf on its devices as soon
  as every tensor it takes is in (scanned layers: a leaf takes one tensor per layer; experts
  stored one per tensor: one per expert, of each layer).

  Raises (on construction):
    UsageError: the source's names (`names`, the family's `HfNames` of `model`) do not cover
      the model's parameters, or name one it lacks.
  """

  def __init__(self, model: Any, abstract: Any, where: str, names: Any):
    self._where = where
    # Where a scanned model keeps layer N's parameters: (the keys of its stacked subtree,
    # its row there), or None for a layer kept unrolled (models/transformer_layers.py).
    self._scanned_position = (getattr(model, "scanned_position", None)
                              if getattr(model, "scan_layers", False) else None)
    self._abstract = abstract
    self._leaves: dict[tuple[str, ...], Any] = {}
    self._pending: dict[tuple[str, ...], tuple[np.ndarray, set[int]]] = {}
    self._absent = tuple(names.absent())
    self._check_covers(names)

  def _find(self, path: str) -> tuple[tuple[str, ...], int | None, Any] | None:
    """(the leaf's key path, the layer it is one row of (scanned layers) or None, its
    abstract value), or None where the model has no such parameter."""
    keys = tuple(path.split("/"))
    layer = None
    if self._scanned_position is not None and keys[0].startswith("layer_"):
      position = self._scanned_position(int(keys[0][len("layer_"):]))
      if position is not None:
        layer, keys = position[1], position[0] + keys[1:]
    node = self._abstract
    for key in keys:
      if not isinstance(node, dict) or key not in node:
        return None
      node = node[key]
    return keys, layer, node

  def _check_covers(self, names: Any) -> None:
    """Refuses names that do not cover the model: a tensor holding a parameter it lacks, or
    a parameter no tensor holds (and `absent()` does not name)."""
    covered = set()
    for tensor in names.tensors():
      for path in tensor.paths:
        found = self._find(path)
        if found is None:
          raise UsageError(f"{self._where}: tensor {tensor.name} holds {path}, a parameter this "
                           f"model does not have{_because(names)}; {_AS_THE_SOURCE}")
        covered.add(found[0])
    for path in self._absent:
      found = self._find(path)
      if found is not None:
        covered.add(found[0])
    missing = ["/".join(keys) for keys, _ in _walk(self._abstract) if keys not in covered]
    if missing:
      more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
      raise UsageError(f"{self._where}: the source holds no tensor for this model's parameter"
                       f"{'s' * (len(missing) > 1)} {', '.join(missing[:3])}{more}"
                       f"{_because(names)}; {_AS_THE_SOURCE}")

  def check_dtype(self, name: TensorName, stored: Any, shown: str | None = None,
                  where: str | None = None, tensor: str | None = None) -> None:
    """Refuses the tensor `name` (the file's `tensor`, where the format names it otherwise),
    stored as `stored` (`shown`: the format's name of it) in the file `where` (the source
    when not given), where its parameters' dtypes do not take it
    (tensor_checks.check_dtype)."""
    leaves = [self._find(path)[2] for path in name.paths]
    tensor_checks.check_dtype(where or self._where, tensor or name.name, stored, name.paths,
                              [leaf.dtype for leaf in leaves], shown)

  def put(self, name: TensorName, tensor: np.ndarray, where: str | None = None) -> None:
    """Places `tensor` (the format's tensor `name`, read from the file `where`: the source
    when not given) into the parameters it holds.

    Raises:
      UsageError: its dtype or its shape is not one the parameters take.
    """
    located = [self._find(path) for path in name.paths]
    self.check_dtype(name, tensor.dtype, where=where)
    shapes = [tuple(leaf.shape[1:] if layer is not None else leaf.shape)
              for _, layer, leaf in located]
    which = f" (expert {name.expert}'s row)" if name.expert is not None else ""
    tensor_checks.check_shape(
        self._where, name.name, tensor.shape, name.format_shape(shapes),
        [f"{path} {list(shape)}{which}" for path, shape in zip(name.paths, shapes)],
        "set the model to the source's sizes (its config), or give weights of this model's")
    parts = name.to_ours(tensor, shapes, self._where)
    for (keys, layer, leaf), part in zip(located, parts):
      part = part.astype(leaf.dtype, copy=False)
      # Where the part goes in the leaf: a layer's row (scanned layers), an expert's row of
      # the layer (a mixture of experts stored one expert per tensor), or the whole leaf.
      row = tuple(index for index in (layer, name.expert) if index is not None)
      if not row:
        self._place(keys, leaf, part)
        continue
      stacked, seen = self._pending.get(keys) or (np.empty(leaf.shape, leaf.dtype), set())
      stacked[row] = part
      seen.add(row)
      self._pending[keys] = (stacked, seen)
      if len(seen) == math.prod(leaf.shape[:len(row)]):
        self._place(keys, leaf, self._pending.pop(keys)[0])

  def _place(self, keys: tuple[str, ...], leaf: Any, value: np.ndarray) -> None:
    self._leaves[keys] = jax.make_array_from_callback(leaf.shape, leaf.sharding,
                                                      lambda index: value[index])

  def finish(self) -> Any:
    """The whole tree: what was put, zeros for the parameters the format has no tensor for
    (`absent()`). Every other parameter was put: the names cover the model (checked on
    construction), and each reader puts every tensor they name."""
    for path in self._absent:
      found = self._find(path)
      if found is not None:
        self._place(found[0], found[2], np.zeros(found[2].shape, found[2].dtype))
    assert not self._pending, f"rows never put: {sorted(self._pending)}"
    return _rebuild(self._abstract, lambda path: self._leaves[path])


def _because(names: Any) -> str:
  """Why names do not cover their model: the fields it has that the format cannot say."""
  try:
    unexpressed = names.unexpressed()
  except UsageError:  # A model its own config cannot describe: nothing more to say.
    return ""
  if not unexpressed:
    return ""
  said = ", ".join(f"model.{field}={getattr(names.model, field)!r}" for field in unexpressed)
  return (f" ({said}: a {names.model_type} checkpoint cannot say "
          f"{'it' if len(unexpressed) == 1 else 'them'}, so the source is not this model)")


def content_crc(array: np.ndarray) -> int:
  """CRC-32 of an array's bytes, in memory order (a fingerprint's part: fast, not secret)."""
  return zlib.crc32(np.ascontiguousarray(array).view(np.uint8).reshape(-1))


def _walk(tree: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
  if isinstance(tree, dict):
    for key, value in tree.items():
      yield from _walk(value, prefix + (key,))
  else:
    yield prefix, tree


def _rebuild(tree: Any, value_at: Callable[[tuple[str, ...]], Any],
             prefix: tuple[str, ...] = ()) -> Any:
  if isinstance(tree, dict):
    return {key: _rebuild(value, value_at, prefix + (key,)) for key, value in tree.items()}
  return value_at(prefix)
