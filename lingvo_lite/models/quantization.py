"""int8 weight matmuls, on Qwix (Google's JAX quantization library, MaxText's since AQT).

`model.quantization` has two settings besides None:

- "int8", for training. Every weight matmul of the blocks (the attention's q, k, v and output
  projections, the MLP's) quantizes both operands to int8 in the forward pass, with an absmax
  scale per channel (per row of the activations, per output column of the weight), multiplies
  in int8 with int32 accumulation and rescales in float32; the backward pass quantizes the
  incoming gradient the same way and multiplies it with the forward pass's int8 operands.
  A scale is absmax / 127.5 (Qwix's rule: the largest value sits at the edge of the top
  bucket, 127, so every bucket is whole). Rounding is to nearest: a step is deterministic.
  This is Qwix's quantized training, the dot `qwix.QtProvider` runs for a `QtRule` with int8
  weights, activations and gradients, called at each weight matmul with its configuration
  built here: the provider would intercept the model's calls and tell the weight from the
  activation by looking it up among the module's parameters (by identity, else by shape,
  which fails where the q, k and v kernels share one), where each call here knows. The
  parameters, their gradients and the optimizer state stay in the parameter dtype
  (quantization lives in the step, not the state), so a float run's checkpoint resumes in
  int8 and back. The token embedding and the output projection stay in the compute dtype.
- "int8_weights", for decoding and serving. Every weight matrix, the embedding and the output
  projection included, is stored as int8 with a float scale per output channel (per vocabulary
  row for the embedding, which serves as both the lookup table and a tied output): decoding
  quantizes the loaded parameters once (`quantize_weights`) and multiplies by the dequantized
  weights, which XLA fuses into the matmul, so the weights are read from memory as int8.
  Activations stay in the compute dtype. A model applied to float weights under this setting
  quantizes them as it multiplies (`eval`, say): the same numbers, without the memory saving.

In both, the attention's score and value einsums are not weight matmuls and stay in the
compute dtype.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

if TYPE_CHECKING:
  import qwix

Quantization = Literal["int8", "int8_weights"]
QUANTIZATIONS: tuple[str, ...] = ("int8", "int8_weights")
# The settings a training step may take ("int8_weights" has no useful gradient: rounding the
# weights is flat almost everywhere).
TRAINABLE: tuple[str | None, ...] = (None, "int8")


def _qwix() -> types.ModuleType:
  """qwix, imported at the first int8 weight: it imports flax.nnx, about 0.7 s that every
  `python -m lingvo_lite` process (and every test process) would pay at start-up without
  quantizing anything."""
  import qwix  # pylint: disable=import-outside-toplevel
  return qwix


@functools.cache
def _int8_training() -> Any:
  """Both operands int8 with absmax scales per channel, and both gradients' dots int8 against
  the forward pass's int8 operands (`QtRule(weight_qtype=int8, act_qtype=int8,
  bwd_qtype=int8)`, as `QtProvider` configures it)."""
  # What `qwix.QtProvider.dot_general` runs (qwix is pinned: requirements.lock).
  from qwix._src.core import dot_general_qt  # pylint: disable=import-outside-toplevel
  return dot_general_qt.DotGeneralQtConfig(
      lhs_qtype=jnp.int8, rhs_qtype=jnp.int8, dlhs_grad_qtype=jnp.int8,
      drhs_grad_qtype=jnp.int8)

DimensionNumbers = tuple[tuple[Sequence[int], Sequence[int]], tuple[Sequence[int], Sequence[int]]]


def is_quantized(weight: Any) -> bool:
  """Whether `weight` is an int8 weight with its scales (`quantize_weights`' output)."""
  # Before qwix is imported no value can be one of its arrays (and float runs never import it).
  module = sys.modules.get("qwix")
  return module is not None and isinstance(weight, module.QArray)


def quantize(weight: jax.Array, contracted: Sequence[int]) -> qwix.QArray:
  """int8 values and a scale per channel: every axis but the `contracted` ones, so that the
  scale factors out of the matmul that contracts them. The scale keeps `weight`'s dtype."""
  channels = [axis for axis in range(weight.ndim) if axis not in set(contracted)]
  return _qwix().quantize(weight, jnp.int8, channelwise_axes=channels)


def dequantize(weight: qwix.QArray) -> jax.Array:
  """An int8 weight's values times their scales, in the scales' dtype."""
  return _qwix().dequantize(weight)


def dot_general(x: jax.Array, weight: Any, dimension_numbers: DimensionNumbers,
                quantization: Quantization | None) -> jax.Array:
  """`jax.lax.dot_general(x, weight, dimension_numbers)` under `quantization`, in x's dtype."""
  if quantization == "int8_weights" and not is_quantized(weight):
    weight = quantize(weight, dimension_numbers[0][1])  # Float weights: as they multiply.
  if is_quantized(weight):
    return _qwix().dot_general(x, weight, dimension_numbers).astype(x.dtype)
  if quantization == "int8":
    from qwix._src.core import dot_general_qt  # pylint: disable=import-outside-toplevel
    return dot_general_qt.dot_general_qt(x, weight, dimension_numbers,
                                         _int8_training()).astype(x.dtype)
  raise ValueError(f"quantization={quantization!r}: not one of {QUANTIZATIONS}")


def take_rows(table: Any, indices: jax.Array, dtype: jnp.dtype) -> jax.Array:
  """`table[indices]` in `dtype`: an int8 table's rows times their scales."""
  if is_quantized(table):
    return (jnp.take(table.qvalue, indices, axis=0).astype(dtype)
            * jnp.take(table.scale, indices, axis=0).astype(dtype))
  return jnp.take(table, indices, axis=0).astype(dtype)


def _contracted_axes(axes: tuple[str | None, ...],
                     contractions: Mapping[tuple[str, ...], tuple[str, ...]]
                     ) -> tuple[int, ...] | None:
  """Which axes of a parameter with these logical `axes` its matmul contracts (None: it is no
  weight matrix); a scanned model's leading `layers` axis is a channel."""
  bare = axes[1:] if axes[:1] == ("layers",) else axes
  if bare not in contractions:
    return None
  return tuple(index for index, name in enumerate(axes) if name in contractions[bare])


def _is_spec(value: Any) -> bool:
  return isinstance(value, PartitionSpec)


def quantize_weights(params: Any, logical_specs: Any,
                     contractions: Mapping[tuple[str, ...], tuple[str, ...]]) -> Any:
  """`params` with every weight matrix as int8 values and scales (`quantize`).

  Args:
    params: The float parameters.
    logical_specs: Their logical axes, a PartitionSpec of axis names per parameter.
    contractions: The family's weight matrices: their logical axes -> the ones their matmul
      contracts (`LanguageModel.int8_weight_contractions`).
  """
  def one(value: jax.Array, spec: PartitionSpec) -> Any:
    contracted = _contracted_axes(tuple(spec), contractions)
    return value if contracted is None else quantize(value, contracted)
  return jax.tree.map(one, params, logical_specs, is_leaf=_is_spec)


def quantized_specs(logical_specs: Any,
                    contractions: Mapping[tuple[str, ...], tuple[str, ...]]) -> Any:
  """The logical axes of `quantize_weights`' output: the int8 values keep the weight's, and the
  scales keep them but for the contracted axes (of size 1, so not split)."""
  def one(spec: PartitionSpec) -> Any:
    contracted = _contracted_axes(tuple(spec), contractions)
    if contracted is None:
      return spec
    scale = PartitionSpec(*(None if index in contracted else name
                            for index, name in enumerate(spec)))
    return _qwix().QArray(qvalue=spec, scale=scale, zero_point=None, qtype=jnp.int8)
  return jax.tree.map(one, logical_specs, is_leaf=_is_spec)


# How int8 weights are stored in a checkpoint (slim weights, `--export_dtype=int8`): each
# weight matrix as a dict of its int8 values and their scales, which any checkpoint library
# writes as two arrays.
STORED_VALUES, STORED_SCALES = "int8", "scale"


def stored_int8(params: Any, logical_specs: Any,
                contractions: Mapping[tuple[str, ...], tuple[str, ...]]) -> Any:
  """`params` with every weight matrix as {"int8": values, "scale": scales}."""
  quantized = quantize_weights(params, logical_specs, contractions)
  return jax.tree.map(lambda leaf: {STORED_VALUES: leaf.qvalue, STORED_SCALES: leaf.scale}
                      if is_quantized(leaf) else leaf, quantized, is_leaf=is_quantized)


def stored_int8_shapes(abstract: Any, logical_specs: Any,
                       contractions: Mapping[tuple[str, ...], tuple[str, ...]]) -> Any:
  """What `stored_int8` writes for parameters of these shapes (ShapeDtypeStructs with
  shardings): the values where the weights live, the (small) scales on every device."""
  def one(leaf: jax.ShapeDtypeStruct, spec: PartitionSpec) -> Any:
    contracted = _contracted_axes(tuple(spec), contractions)
    if contracted is None:
      return leaf
    scale_shape = tuple(1 if axis in contracted else size
                        for axis, size in enumerate(leaf.shape))
    replicated = jax.sharding.NamedSharding(leaf.sharding.mesh, PartitionSpec())
    return {STORED_VALUES: jax.ShapeDtypeStruct(leaf.shape, jnp.int8, sharding=leaf.sharding),
            STORED_SCALES: jax.ShapeDtypeStruct(scale_shape, leaf.dtype, sharding=replicated)}
  return jax.tree.map(one, abstract, logical_specs, is_leaf=_is_spec)


def _is_stored(value: Any) -> bool:
  return isinstance(value, dict) and set(value) == {STORED_VALUES, STORED_SCALES}


def read_stored_int8(stored: Any) -> Any:
  """`stored_int8`'s tree with each weight matrix back as values times scales, in the scales'
  dtype (quantizing them again for int8 decoding rounds them anew: a scale may move by 1/255)."""
  return jax.tree.map(lambda leaf: (leaf[STORED_VALUES].astype(leaf[STORED_SCALES].dtype)
                                    * leaf[STORED_SCALES]) if _is_stored(leaf) else leaf,
                      stored, is_leaf=_is_stored)


def weight_bytes(params: Any) -> int:
  """The bytes `params` occupy (int8 values and their scales counted as stored)."""
  return sum(leaf.size * jnp.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(params))
