"""A GGUF file's header checked against itself, before any tensor is read: the `gguf` package
reads whatever a file says without complaint, so a file that contradicts itself (edited or
damaged) would load as another model, or as garbage.

Three rules, none listed per family (each follows from what every family already says about
its format, so a new family cannot forget one):

  - Layout: each tensor's bytes are what its type and shape take, up to the next tensor (a
    type id changed in place to another type of another size breaks that).
  - Sizes: the model the metadata describes (`GgufNames.hf_config`, then the Hugging Face
    names' `fields`) reads every tensor in the shape the file holds: its `blk.N.` blocks are
    `<arch>.block_count`'s, and each tensor's shape is the one the model's parameters make
    (`expected_shapes`: the family's `HfNames.tensors()` over the model's parameter shapes,
    through its `GgufNames.tensors()`). A tensor of another shape is refused naming the key
    whose value makes it so: the key that, scaled as the dimension is off, makes every tensor
    fit (each where the tensors cannot tell two apart: `_Lie`), else the key without which
    the metadata describes the tensors, else the tensor and both shapes.
  - Round trip: every integer key the family writes (`GgufNames.metadata()` of that model)
    that the file holds says what the model has. This catches a key that the family reads
    from elsewhere (`gptj.vocab_size`, taken from the token table) or not at all
    (`llama.rope.dimension_count`), which the sizes alone would let through.

A key the tensors cannot contradict is read as the file says: a context length (rotary
positions have no table), a window, the experts used per token, or GPT-2's and GPT-J's head
count (their query is [width, width] whatever the heads). A model no sizes build (heads that do
not group, an absurd count) is left to the model's field checks, which name the field, unless
a key without which the metadata describes the tensors is found.

Quantized types (Q4_1, Q8_0, the K-quants) are sized by their blocks, and so pass.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Mapping

from lingvo_lite.errors import UsageError
from lingvo_lite.models import format_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.format_names import GgufNames, HfNames

# llama.cpp's names put each block's tensors under `blk.N.`.
_BLOCK = re.compile(r"^blk\.(\d+)\.")
CONVERT = "the file contradicts itself (edited or damaged): convert the model again"
# What a family's reading of sizes it cannot build a model of raises (a zero, a ratio that
# does not divide): such a candidate value explains nothing.
_UNBUILDABLE = (UsageError, ValueError, TypeError, ArithmeticError, KeyError, IndexError)


def check_layout(reader: Any, where: str) -> None:
  """Refuses a file whose tensors do not fill its data section as their types and shapes say.

  llama.cpp (and the gguf package) write each tensor's bytes at the offset its info gives,
  padded to the file's alignment, one after the other: the bytes up to the next tensor (or the
  end of the file) are the tensor's size, plus less than one alignment of padding. A type id
  changed to another type of another size (F32 to F16, to a K-quant) breaks that; the reader
  would slice the wrong bytes and dequantize them without complaint.
  """
  tensors = sorted(reader.tensors, key=lambda tensor: tensor.data_offset)
  ends = [tensor.data_offset for tensor in tensors[1:]] + [len(reader.data)]
  for tensor, end in zip(tensors, ends):
    room = end - tensor.data_offset
    if not tensor.n_bytes <= room < tensor.n_bytes + reader.alignment:
      shape = [int(d) for d in reversed(tensor.shape)]
      raise UsageError(f"{where}: tensor {tensor.name} is {tensor.tensor_type.name} of shape "
                       f"{shape}, {tensor.n_bytes} bytes, but the file holds {room} bytes for "
                       f"it: its type or shape was changed, or {CONVERT}")


def model_fields(family: type, names: type[GgufNames], metadata: Mapping[str, Any],
                 shapes: Mapping[str, tuple[int, ...]], where: str) -> dict[str, Any]:
  """The fields of the `family` model the file's `metadata` describes (its `names`; `shapes`:
  each tensor's, in torch's axis order), once its sizes and its tensors agree.

  Raises:
    UsageError: a key the family refuses, or one that contradicts the tensors (naming both).
  """
  arch = metadata.get("general.architecture")
  _check_blocks(arch, metadata.get(f"{arch}.block_count"), shapes, where)
  fields = _fields(family, names, metadata, shapes, where)
  lie = _Lie(family, names, metadata, shapes, where)
  try:
    model = family(**fields)
    model.check_size()  # Listing an absurd count's tensors would never end.
    expected = expected_shapes(model)
  except _UNBUILDABLE:
    # No model has these sizes (heads that do not group, an odd head width): a key the
    # tensors contradict is named; else the model's field checks name the field.
    found = lie.removed()
    if found:
      raise lie.refusal(*found)
    return fields
  wrong = _mismatches(expected, shapes)
  if wrong:
    raise lie.size_refusal(wrong[0], len(wrong), expected)
  written = format_names.bound(model, GgufNames).metadata()
  for key, value in written.items():
    stated = metadata.get(f"{arch}.{key}")
    if _is_int(stated) and _is_int(value) and stated != value:
      raise lie.refusal(key, value)
  return fields


def _fields(family: type, names: type[GgufNames], metadata: Mapping[str, Any],
            shapes: Mapping[str, tuple[int, ...]], where: str) -> dict[str, Any]:
  config = names.hf_config(metadata, shapes)
  fields = format_names.names_of(family, HfNames).fields(
      HfConfig(config, f"{where} (its metadata)"))
  return {k: v for k, v in fields.items() if v is not None}


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _check_blocks(arch: Any, blocks: Any, shapes: Mapping[str, tuple[int, ...]],
                  where: str) -> None:
  """Refuses a `block_count` that is not the number of `blk.N.` blocks the file holds."""
  if not _is_int(blocks):
    return
  found: dict[int, str] = {}
  for name in shapes:
    match = _BLOCK.match(name)
    if match:
      found.setdefault(int(match.group(1)), name)
  extra = sorted(block for block in found if block >= blocks)
  # The first block missing, found without listing an absurd count's range.
  missing = next((block for block in range(blocks) if block not in found), None)
  if extra:
    raise UsageError(f"{where}: {arch}.block_count={blocks}, but the file holds tensor "
                     f"{found[extra[0]]} of block {extra[0]}; {CONVERT}")
  if missing is not None:
    raise UsageError(f"{where}: {arch}.block_count={blocks}, but the file holds no tensor of "
                     f"block {missing} (blk.{missing}.*); {CONVERT}")


@functools.lru_cache(maxsize=64)
def expected_shapes(model: Any) -> dict[str, tuple[int, ...]]:
  """Each GGUF tensor of `model` (a family instance with GGUF names) -> its shape, in torch's
  axis order: its Hugging Face tensor's (`TensorName.format_shape` of the parameters it holds,
  from `parameter_shapes`: nothing allocated), as llama.cpp's converter stores it
  (`GgufTensor.shape_from_hf`)."""
  # Every attention kind has the same parameters (`parameter_shapes`' premise): all full,
  # the layers repeat with the feed-forward kinds alone, and one period is traced.
  unrolled = model.clone(parent=None, scan_layers=False, layer_kinds=("full",))
  by_path = {"/".join(re.findall(r"\['([^']*)'\]", shape.path)): tuple(shape.shape)
             for shape in unrolled.parameter_shapes()}
  # `parameter_shapes` names the layers of a short stack (models/transformer_layers.py's
  # `sample_layers`: a prefix and one period), each standing for others.

  def shape_of(path: str) -> tuple[int, ...]:
    first, _, rest = path.partition("/")
    if first.startswith("layer_"):
      return by_path[f"layer_{unrolled.sample_layer(int(first[len('layer_'):]))}/{rest}"]
    return by_path[path]

  hf = {tensor.name: tensor.format_shape([shape_of(path) for path in tensor.paths])
        for tensor in format_names.bound(model, HfNames).tensors()}
  return {name: tuple(tensor.shape_from_hf(hf[tensor.hf_names()[0]]))
          for name, tensor in format_names.bound(model, GgufNames).tensors().items()}


def _mismatches(expected: Mapping[str, tuple[int, ...]], shapes: Mapping[str, tuple[int, ...]]
                ) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
  """(tensor, the shape the model makes it, the file's) of each tensor the file holds in
  another shape (a tensor it lacks is named when the model reads it)."""
  return [(name, shape, tuple(shapes[name])) for name, shape in expected.items()
          if name in shapes and tuple(shapes[name]) != shape]


def _shapes_of(model: Any) -> dict[str, tuple[int, ...]] | None:
  """`expected_shapes(model)`, or None where the model cannot be traced (sizes that do not
  divide); None for None."""
  if model is None:
    return None
  try:
    return expected_shapes(model)
  except _UNBUILDABLE:
    return None


class _Lie:
  """Finds the metadata key a file's tensors contradict, on a refusal only: each try builds a
  model with one key changed and traces its shapes (nothing allocated).

  The integer keys tried are the file's `<arch>.*` ones but `block_count` (checked on its
  own); they are named without the prefix.
  """

  def __init__(self, family: type, names: type[GgufNames], metadata: Mapping[str, Any],
               shapes: Mapping[str, tuple[int, ...]], where: str):
    self._family, self._names, self._where = family, names, where
    self._metadata, self._held = dict(metadata), shapes
    self._arch = metadata.get("general.architecture")
    self._keys = [key[len(f"{self._arch}."):] for key, value in metadata.items()
                  if key.startswith(f"{self._arch}.") and key != f"{self._arch}.block_count"
                  and _is_int(value) and value > 0]

  def _value(self, key: str) -> int:
    return self._metadata[f"{self._arch}.{key}"]

  def refusal(self, key: str, value: int) -> UsageError:
    """The one line for `key`, which the tensors and the other keys make `value`."""
    return UsageError(f"{self._where}: {self._arch}.{key}={self._value(key)}, but the model "
                      f"its tensors and other keys describe has {value}; {CONVERT}")

  def _model(self, changes: Mapping[str, int | None]) -> Any:
    """The model the metadata describes with `changes` made (None: the key left out), or
    None where no model has those sizes (nothing traced)."""
    changed = dict(self._metadata)
    for key, value in changes.items():
      changed.pop(f"{self._arch}.{key}", None)
      if value is not None:
        changed[f"{self._arch}.{key}"] = value
    try:
      model = self._family(**_fields(self._family, self._names, changed, self._held,
                                     self._where))
      model.check_size()
      return model
    except _UNBUILDABLE:
      return None


  def removed(self) -> tuple[str, int] | None:
    """(the key without which the metadata describes a model that reads every tensor as the
    file holds it, the value that model writes for it), or None."""
    for key in self._keys:
      model = self._model({key: None})
      shapes = _shapes_of(model)
      if shapes is None or _mismatches(shapes, self._held):
        continue
      value = format_names.bound(model, GgufNames).metadata().get(key)
      if _is_int(value) and value != self._value(key):
        return key, value
    return None

  def size_refusal(self, wrong: tuple[str, tuple[int, ...], tuple[int, ...]], count: int,
                   expected: Mapping[str, tuple[int, ...]]) -> UsageError:
    """The one line for a tensor whose shape (`wrong`: name, the model's, the file's) is not
    the one the metadata makes, one of `count` such: naming the keys that, scaled as the
    dimension is off, make every tensor fit (or the most); else the key without which all
    fit; else the shapes alone (a key can hide in a rounded ratio: 64 // 5 * 5 is 64 // 6 * 6).
    """
    name, made, held = wrong
    axes = [axis for axis in range(min(len(made), len(held))) if made[axis] != held[axis]]
    keys = self._scaled(name, held, made, axes[0], count, expected) if axes else []
    if keys:
      given = " or ".join(f"{self._arch}.{key}={self._value(key)}" for key in keys)
      return UsageError(f"{self._where}: {given} makes dimension {axes[0]} of tensor {name} "
                        f"{made[axes[0]]}, but its shape is {list(held)}; {CONVERT}")
    found = self.removed()
    if found:
      return self.refusal(*found)
    return UsageError(f"{self._where}: its metadata makes tensor {name} {list(made)}, but its "
                      f"shape is {list(held)}; {CONVERT}")

  def _scaled(self, name: str, held: tuple[int, ...], made: tuple[int, ...], axis: int,
              count: int, expected: Mapping[str, tuple[int, ...]]) -> list[str]:
    """The keys that, scaled by the file's size of dimension `axis` over the model's (or its
    inverse: a head count divides the width into heads), make every tensor fit: more than one
    where the tensors cannot tell (8 heads of 8 with 2 key-value heads, or 4 of 16?). Else
    [the key that makes tensor `name` fit and the fewest others off, fewer than `count`], or
    [].

    Each try is a trace, so tries are ordered by their parameter count (`num_parameters`,
    counted without one): first those with as many more or fewer parameters as the file's
    tensors have elements beyond the ones the metadata's model (`expected`: its tensors'
    shapes) makes; none with the metadata's own count (a key that sizes no parameter, a
    context length, fixes no shape); once one fits, only those with its count."""
    base = self._model({})
    base_count = _count(base)
    target = None if base_count is None else base_count + sum(
        math.prod(self._held[tensor]) - math.prod(shape)
        for tensor, shape in expected.items() if tensor in self._held)
    tries = []
    for key in self._keys:
      value = self._value(key)
      for numerator, denominator in ((held[axis], made[axis]), (made[axis], held[axis])):
        scaled, remainder = divmod(value * numerator, denominator)
        if remainder or scaled <= 0 or scaled == value:
          continue
        model = self._model({key: scaled})
        if model is not None and model != base and _count(model) != base_count:
          tries.append((_count(model) != target, len(tries), key, model))
    fits: list[str] = []
    fit_count = None
    best: tuple[int, str] | None = None
    for _, _, key, model in sorted(tries, key=lambda tried: tried[:2]):
      if key in fits or (fit_count is not None and _count(model) != fit_count):
        continue
      tried = _shapes_of(model)
      if tried is None or tried.get(name) != held:
        continue
      left = len(_mismatches(tried, self._held))
      if left == 0:
        fits.append(key)
        fit_count = _count(model)
      elif left < count and (best is None or left < best[0]):
        best = (left, key)
    if fits:
      return fits
    return [best[1]] if best else []


def _count(model: Any) -> int | None:
  """The model's parameter count (from its sizes), or None where it has none."""
  try:
    return model.num_parameters()
  except _UNBUILDABLE:
    return None
