"""Tensors of another format placed into a model's parameters, by the rules every format keeps.

A Hugging Face folder (hf_checkpoint.py) and a GGUF file (gguf_checkpoint.py) both name their
tensors as the family's `HfNames.tensors()` does; `Placer` converts each to the parameters it
holds (`TensorName.to_ours`), casts it to the parameter's dtype and puts it on its devices as soon
as the parameter is whole. What a file holds must be what the model reads, or be said:

  - Float widths convert (float64, float32, float16, bfloat16 into the parameter's dtype, as
    transformers' `from_pretrained` casts them); GGUF's quantized types are dequantized to
    float32 first. An integer or boolean tensor where a float weight belongs is refused, one
    line naming the file and the tensor: cast, its values would be garbage weights that load
    and run.
  - A shape that is not the parameter's is refused, naming the tensor (`TensorName.to_ours`).
  - A tensor that no part of the model reads (`rotary_emb.inv_freq`, which older Llama folders
    hold; the `lm_head` copy of a tied model) is not an error: the loaders name all of them in
    one warning line (`warn_unread`), as transformers does, and load the rest.

The fingerprint of what was loaded hashes each tensor's bytes with `content_crc`.
"""

from __future__ import annotations

import math
import sys
import zlib
from typing import Any, Callable, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from lingvo_lite.errors import UsageError, one_line
from lingvo_lite.models.checkpoint_names import TensorName

# Unread tensors a warning names before it counts the rest.
_NAMED_UNREAD = 5


def not_a_float_weight(where: str, tensor: str, dtype: str, name: TensorName) -> UsageError:
  """The refusal of tensor `tensor` (stored as `dtype`, integers or booleans) of the file
  `where`, which the model reads as the float weight(s) `name.paths`."""
  return UsageError(f"{where}: tensor {tensor} is {dtype}, not floating point, where the model "
                    f"reads the float weight {', '.join(name.paths)}; weights convert between "
                    "float widths (float64, float32, float16, bfloat16), never from integers: "
                    "give the model's float weights")


def is_float(dtype: Any) -> bool:
  """A floating-point dtype: NumPy's, and ml_dtypes' (bfloat16)."""
  return bool(jnp.issubdtype(dtype, jnp.floating))


def warn_unread(where: str, names: Iterable[str]) -> None:
  """One warning line on stderr naming the tensors of `where` that no part of the model read
  (nothing when there are none)."""
  unread = sorted(names)
  if not unread:
    return
  shown = ", ".join(unread[:_NAMED_UNREAD])
  more = f" and {len(unread) - _NAMED_UNREAD} more" if len(unread) > _NAMED_UNREAD else ""
  count = f"{len(unread)} tensor{'s' * (len(unread) != 1)}"
  print(one_line(f"lingvo_lite: warning: {where}: {count} that no part of the model reads, "
                 f"left unread: {shown}{more}"), file=sys.stderr, flush=True)


class Placer:
  """Puts converted tensors into the model's parameter tree, each leaf on its devices as soon
  as every tensor it takes is in (scanned layers: a leaf takes one tensor per layer; experts
  stored one per tensor: one per expert, of each layer)."""

  def __init__(self, model: Any, abstract: Any, where: str):
    self._where = where
    # Where a scanned model keeps layer N's parameters: (the keys of its stacked subtree,
    # its row there), or None for a layer kept unrolled (models/transformer_layers.py).
    self._scanned_position = (getattr(model, "scanned_position", None)
                              if getattr(model, "scan_layers", False) else None)
    self._abstract = abstract
    self._leaves: dict[tuple[str, ...], Any] = {}
    self._pending: dict[tuple[str, ...], tuple[np.ndarray, set[int]]] = {}

  def _locate(self, path: str) -> tuple[tuple[str, ...], int | None, Any]:
    """(the leaf's key path, the layer it is one row of (scanned layers) or None, its
    abstract value)."""
    keys = tuple(path.split("/"))
    layer = None
    if self._scanned_position is not None and keys[0].startswith("layer_"):
      position = self._scanned_position(int(keys[0][len("layer_"):]))
      if position is not None:
        layer, keys = position[1], position[0] + keys[1:]
    node = self._abstract
    for key in keys:
      if not isinstance(node, dict) or key not in node:
        raise UsageError(f"{self._where}: the model has no parameter {path}; its family's "
                         "names do not match its config (a bug: report it)")
      node = node[key]
    return keys, layer, node

  def put(self, name: TensorName, tensor: np.ndarray, where: str | None = None) -> None:
    """Places `tensor` (the format's tensor `name`, read from the file `where`: the source
    when not given) into the parameters it holds.

    Raises:
      UsageError: it holds integers where a float weight belongs, or its shape is not the
        parameters'.
    """
    located = [self._locate(path) for path in name.paths]
    if not is_float(tensor.dtype) and all(is_float(leaf.dtype) for _, _, leaf in located):
      raise not_a_float_weight(where or self._where, name.name, str(tensor.dtype), name)
    shapes = [leaf.shape[1:] if layer is not None else leaf.shape
              for _, layer, leaf in located]
    parts = name.to_ours(tensor, [tuple(s) for s in shapes], self._where)
    expert = getattr(name, "expert", None)
    for (keys, layer, leaf), part in zip(located, parts):
      part = part.astype(leaf.dtype, copy=False)
      # Where the part goes in the leaf: a layer's row (scanned layers), an expert's row of
      # the layer (a mixture of experts stored one expert per tensor), or the whole leaf.
      row = tuple(index for index in (layer, expert) if index is not None)
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

  def finish(self, absent: tuple[str, ...]) -> Any:
    """The whole tree: what was put, zeros for the `absent` parameters.

    Raises:
      UsageError: a parameter no tensor filled (a family's names missing one: a bug).
    """
    for path in absent:
      keys, _, leaf = self._locate(path)
      self._place(keys, leaf, np.zeros(leaf.shape, leaf.dtype))
    missing = [path for path, _ in _walk(self._abstract) if path not in self._leaves]
    if missing or self._pending:
      names = ["/".join(p) for p in missing] + ["/".join(k) for k in self._pending]
      raise UsageError(f"{self._where}: no tensor for the parameters {', '.join(names[:5])}; "
                       "the family's names miss them (a bug: report it)")
    return _rebuild(self._abstract, lambda path: self._leaves[path])


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
