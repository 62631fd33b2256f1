"""How a family's parameters map to another format's tensors, and its settings to that format's
config: the vocabulary each family's module uses to say both (models/llama.py and its peers).

A Hugging Face folder names its tensors (`model.layers.0.self_attn.q_proj.weight`) and stores
torch's `nn.Linear` weights as [out, in]; lingvo_lite names parameters by their Flax path
(`layer_0/attention/query_kernel`) and stores kernels as [in, ...out] with heads as their own
axis. A `TensorName` relates one tensor of the format to the parameters it holds, and converts
both ways with the same fields, so import and export cannot disagree:

  TensorName("model.layers.0.self_attn.q_proj.weight", ("layer_0/attention/query_kernel",))

A fused tensor (GPT-2's `c_attn`: query, key and value along its output axis) names several
parameters; a mixture of experts' per-expert tensor (`block_sparse_moe.experts.3.w1.weight`)
is one row of a parameter stacked over the experts (`expert`). A family names its tensors as
rows (models/tensor_rows.py), which make these. `HfConfig` reads a source's config.json for a
family's `HfNames.fields`, and refuses in one line a setting the family does not implement,
naming the key.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from lingvo_lite.errors import UsageError


@dataclasses.dataclass(frozen=True)
class TensorName:
  """One tensor of another format and the parameters it holds.

  Attributes:
    name: The tensor's name in the other format.
    paths: Our parameters it holds (`layer_0/attention/query_kernel`), in the order they lie
      along its output axis (one, except for fused tensors).
    input_axes: How many of each parameter's leading axes make the tensor's input axis (the
      rest make its output axis): 1 for a kernel [dim, heads, head_dim], 2 for an output
      kernel [heads, head_dim, dim], 0 for a vector (a bias, a norm's scale).
    transposed: The format stores the matrix as [out, in] (torch's `nn.Linear`), where our
      kernels are [in, out]; False for [in, out] (GPT-2's `Conv1D`) and for tables indexed
      by token (an embedding).
    expert: The tensor is row `expert` of each parameter's leading (`experts`) axis (a
      mixture of experts stored one expert per tensor); None: the whole parameters. Shapes
      given to the methods below are the whole parameters'.
    interleaved: Parameters fused along the output axis alternate column by column (gpt-oss's
      `gate_up_proj`: gate, up, gate, up, ...) instead of lying one after the other.
    stacked: The tensor keeps the parameters' leading axes as its own ([experts, in, out]:
      gpt-oss's experts, stored [in, out] per expert), instead of a matrix.
  """

  name: str
  paths: tuple[str, ...]
  input_axes: int = 1
  transposed: bool = True
  expert: int | None = None
  interleaved: bool = False
  stacked: int = 0

  def _rows(self, shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The shapes the tensor holds: one expert's row of each parameter, or the whole."""
    return [tuple(shape[1:]) if self.expert is not None else tuple(shape) for shape in shapes]

  def to_ours(self, tensor: np.ndarray, shapes: Sequence[tuple[int, ...]],
              where: str) -> list[np.ndarray]:
    """What the tensor holds of the parameters of `paths`, shaped `shapes` (with `expert`,
    their row of that expert), from the format's tensor.

    Raises:
      UsageError: the tensor's shape is not the one these parameters need (named with
        `where`, the source).
    """
    expected = self.format_shape(shapes)
    if tuple(tensor.shape) != expected:
      ours = ", ".join(f"{path} {list(shape)}" for path, shape in zip(self.paths, shapes))
      which = f" (expert {self.expert}'s row)" if self.expert is not None else ""
      raise UsageError(f"{where}: tensor {self.name} has shape {list(tensor.shape)}, but this "
                       f"model's {ours}{which} need {list(expected)}; set the model to the "
                       "source's sizes (its config), or give weights of this model's")
    shapes = self._rows(shapes)
    lead = self.stacked
    matrix = tensor.reshape(*tensor.shape[:lead], -1, tensor.shape[-1]) if lead else tensor
    if self.transposed and matrix.ndim - lead == 2:
      matrix = np.swapaxes(matrix, -1, -2)
    widths = [math.prod(shape[lead + self.input_axes:]) if self.input_axes
              else math.prod(shape[lead:]) for shape in shapes]
    if len(shapes) == 1:
      parts = [matrix]
    elif self.interleaved:
      parts = [matrix[..., index::len(shapes)] for index in range(len(shapes))]
    else:
      parts = np.split(matrix, np.cumsum(widths)[:-1], axis=-1)
    return [np.ascontiguousarray(part).reshape(shape) for part, shape in zip(parts, shapes)]

  def from_ours(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The format's tensor from the parameters of `paths` (the inverse of `to_ours`)."""
    if self.expert is not None:
      arrays = [array[self.expert] for array in arrays]
    lead = self.stacked
    parts = [array.reshape(*array.shape[:lead], -1) if not self.input_axes
             else array.reshape(*array.shape[:lead],
                                math.prod(array.shape[lead:lead + self.input_axes]), -1)
             for array in arrays]
    if len(parts) == 1:
      matrix = parts[0]
    elif self.interleaved:
      matrix = np.stack(parts, axis=-1).reshape(*parts[0].shape[:-1], -1)
    else:
      matrix = np.concatenate(parts, axis=-1)
    if self.transposed and matrix.ndim - lead == 2:
      matrix = np.swapaxes(matrix, -1, -2)
    return np.ascontiguousarray(matrix)

  def format_shape(self, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The shape of the format's tensor holding parameters of `shapes` (whole parameters)."""
    shapes = self._rows(shapes)
    lead = tuple(shapes[0][:self.stacked])
    inner = [shape[self.stacked:] for shape in shapes]
    if not self.input_axes:
      return lead + (sum(math.prod(shape) for shape in inner),)
    rows = math.prod(inner[0][:self.input_axes])
    columns = sum(math.prod(shape[self.input_axes:]) for shape in inner)
    return lead + ((columns, rows) if self.transposed else (rows, columns))


class HfConfig:
  """A Hugging Face config.json, read key by key for a family's `HfNames.fields`.

  Attributes:
    values: The file's keys and values.
    where: The file, for messages.
  """

  def __init__(self, values: Mapping[str, Any], where: str):
    self.values = dict(values)
    self.where = where

  def get(self, key: str, default: Any = None) -> Any:
    value = self.values.get(key)
    return default if value is None else value

  def require(self, key: str) -> Any:
    if self.values.get(key) is None:
      raise UsageError(f"{self.where}: no {key!r}; a {self.get('model_type')} config.json "
                       "names it (a file from transformers' save_pretrained has it)")
    return self.values[key]

  def refuse(self, key: str, value: Any, why: str, fix: str) -> UsageError:
    """The one-line refusal of a setting (`key` = `value`) the family does not implement."""
    return UsageError(f"{self.where}: {key}={value!r}: {why}; {fix}")

  def expect(self, key: str, allowed: Sequence[Any], default: Any = None) -> Any:
    """The key's value, which must be one of `allowed` (a missing key reads as `default`)."""
    value = self.get(key, default)
    if value not in allowed:
      raise self.refuse(key, value, "lingvo_lite's " f"{self.get('model_type')} does not "
                        "implement it", f"supported: {', '.join(map(repr, allowed))}")
    return value

  # Typed reads: a value of the wrong JSON type is one line naming the key, never a traceback
  # or a silent conversion ("yes" is not True).

  def number(self, key: str, default: float | None = None) -> float | None:
    value = self.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
      raise self.refuse(key, value, "must be a number", "fix the file")
    return None if value is None else float(value)

  def flag(self, key: str, default: bool = False) -> bool:
    value = self.get(key, default)
    if not isinstance(value, bool):
      raise self.refuse(key, value, "must be true or false", "fix the file")
    return value

  def mapping(self, key: str) -> dict[str, Any]:
    value = self.get(key, {})
    if not isinstance(value, dict):
      raise self.refuse(key, value, "must be a JSON object", "fix the file")
    return value

  def rope_theta(self, default: float = 10000.0) -> float:
    """The rotary base: `rope_parameters.rope_theta` (transformers 5) or `rope_theta`."""
    parameters = HfConfig(self.mapping("rope_parameters"), self.where)
    theta = parameters.number("rope_theta")
    return theta if theta is not None else self.number("rope_theta", default)

  def rope_scaling(self) -> dict[str, Any] | None:
    """The rotary scaling (`rope_scaling`, or transformers 5's `rope_parameters` beyond the
    base), None for plain rotary positions."""
    scaling = self.mapping("rope_scaling") or {
        k: v for k, v in self.mapping("rope_parameters").items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    return None if kind == "default" else dict(scaling, rope_type=kind)


def rotary_pairs_to_halves(weight: np.ndarray, heads: int) -> np.ndarray:
  """A query or key projection [heads * head_dim, in] whose rows hold each head's rotary
  pairs side by side (GGML's rope, which llama.cpp's converter arranges Llama weights for)
  rearranged for rotate-half (Hugging Face's Llama, `rotary_style="half"`): within each head,
  row 2i + j (j = 0, 1) goes to row j * head_dim / 2 + i."""
  rows = weight.shape[0]
  half = rows // heads // 2
  return (weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2)
          .reshape(weight.shape))


def rotary_halves_to_pairs(weight: np.ndarray, heads: int) -> np.ndarray:
  """The inverse of `rotary_pairs_to_halves`: a rotate-half query or key projection with each
  head's rotary pairs put side by side again (GGML's rope), as llama.cpp's converter writes it:
  within each head, row j * head_dim / 2 + i goes to row 2i + j."""
  rows = weight.shape[0]
  half = rows // heads // 2
  return (weight.reshape(heads, 2, half, *weight.shape[1:]).swapaxes(1, 2)
          .reshape(weight.shape))


@dataclasses.dataclass(frozen=True)
class GgufTensor:
  """One GGUF tensor as the Hugging Face tensor(s) it was converted from (llama.cpp's
  converter names it, and rearranges some): a GGUF file reads as that Hugging Face folder.

  Attributes:
    hf: The Hugging Face tensor's name (one of the family's `HfNames.tensors()`); with
      `experts`, a pattern with `{expert}` in it.
    rotary_heads: For a query or key projection whose rotary pairs GGML's rope wants side by
      side (llama.cpp's Llama): the number of heads; else None.
    transposed: The Hugging Face tensor's last two axes are [in, out] (GPT-2's `Conv1D`,
      gpt-oss's experts), which GGUF stores as [out, in], as it does every matrix.
    offset: What llama.cpp's converter added to the Hugging Face values: 1 for Gemma's norms,
      which it stores as the scale they compute with (1 + weight); else 0.
    experts: The GGUF tensor stacks this many Hugging Face tensors, `hf` of expert 0, 1, ...,
      on a leading axis (llama.cpp's `*_exps`); 0: one tensor.
    columns: (index, count): the GGUF tensor is the Hugging Face tensor's last-axis columns
      index, index + count, ... (gpt-oss's `gate_up_proj` alternates gate and up columns,
      which llama.cpp stores as two tensors); None: all of it.
  """

  hf: str
  rotary_heads: int | None = None
  transposed: bool = False
  offset: float = 0.0
  experts: int = 0
  columns: tuple[int, int] | None = None

  def hf_names(self) -> list[str]:
    """The Hugging Face tensors it holds (one, or one per expert, in order)."""
    if not self.experts:
      return [self.hf]
    return [self.hf.format(expert=expert) for expert in range(self.experts)]

  def to_hf(self, values: np.ndarray) -> np.ndarray:
    """From the GGUF tensor (dequantized, in torch's axis order): the Hugging Face tensor
    (with `experts`, stacked; with `columns`, the columns it holds)."""
    if self.offset:
      values = values - np.asarray(self.offset, values.dtype)
    if self.rotary_heads is not None:
      values = rotary_pairs_to_halves(values, self.rotary_heads)
    return np.ascontiguousarray(np.swapaxes(values, -1, -2)) if self.transposed else values

  def shape_from_hf(self, shape: Sequence[int]) -> tuple[int, ...]:
    """The shape `from_hf` gives a Hugging Face tensor of `shape` (one expert's)."""
    shape = list(shape)
    if self.columns is not None:
      shape[-1] //= self.columns[1]
    if self.transposed:
      shape[-2:] = reversed(shape[-2:])
    return (self.experts, *shape) if self.experts else tuple(shape)

  def from_hf(self, values: np.ndarray) -> np.ndarray:
    """The GGUF tensor from the Hugging Face one (with `experts`, the experts' stacked): the
    inverse of `to_hf`."""
    if self.columns is not None:
      index, count = self.columns
      values = values[..., index::count]
    values = np.ascontiguousarray(np.swapaxes(values, -1, -2)) if self.transposed else values
    if self.rotary_heads is not None:
      values = rotary_halves_to_pairs(values, self.rotary_heads)
    if self.offset:
      values = values + np.asarray(self.offset, values.dtype)
    return values
