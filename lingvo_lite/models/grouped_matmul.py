"""The dropless experts' grouped matmul: `jax.lax.ragged_dot`, with a batching rule that
XLA:TPU compiles.

Under `jax.vmap` (the pipeline's stage axis, models/pipeline.py) JAX batches `ragged_dot`
into a `ragged_dot_general` with a batch dimension, and XLA:TPU refuses that form ("number of
batch dimensions should be 0"), so a pipelined dropless mixture did not compile for a TPU.
Here every product of the grouped matmul, the forward one and the two of its backward pass,
is a `jax.custom_batching.custom_vmap` function whose rule folds the mapped axis into the
groups: member b's group g becomes group b x (G + 1) + g, the members' rows one after the
other, one product without a batch dimension, its output cut back per member. Each member's
rows past its groups (a device holding some of the experts sorts the others' rows there,
models/moe_parallel.py) fall into the extra group G, of zero weights in the forward product
(zeros, as `ragged_dot` gives them) and thrown away in the weights' gradient. A mapped axis of
one is squeezed instead: the stage axis under its mesh axis, where each device holds one stage
(the vmap's `spmd_axis_name` reaches `shard_map`'s body as an axis of one).

`custom_vmap` functions do not differentiate, so the grouped matmul is a `jax.custom_vjp`
around them (the order JAX documents) whose backward pass is the two products JAX's own
transpose of `ragged_dot` makes: the rows' gradient (the output's gradient against the
weights, contracted over their output width) and the weights' (ragged over the contracted
rows, one [in, out] block per group), in the forward's `preferred_element_type`. Forward-mode
differentiation (`jax.jvp`) of a `custom_vjp` is not defined; nothing here asks for it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jax.lax import RaggedDotDimensionNumbers

# The three products, by the shapes of (lhs, rhs) -> out, with the G groups ragged over N rows.
_FORMS = {
    # [N, K] x [G, K, F] -> [N, F]: the forward product (`jax.lax.ragged_dot`'s).
    "rows": RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), [0], [0]),
    # [N, F] x [G, K, F] -> [N, K]: the rows' gradient.
    "rows_transposed": RaggedDotDimensionNumbers((((1,), (2,)), ((), ())), [0], [0]),
    # [N, K] x [N, F] -> [G, K, F]: the weights' gradient.
    "groups": RaggedDotDimensionNumbers((((0,), (0,)), ((), ())), [0], []),
}


def ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array,
               preferred_element_type: Any = None) -> jax.Array:
  """`jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=...)`: lhs [N, K], the
  first group_sizes[0] rows group 0's, and so on, times rhs [G, K, F] of their group ([N, F];
  rows past the groups give zeros), computed by the same XLA instruction, but batched by
  `jax.vmap` into products without a batch dimension (the module doc)."""
  dtype = None if preferred_element_type is None else jnp.dtype(preferred_element_type)
  return _grouped(lhs, rhs, group_sizes, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _grouped(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, dtype: Any) -> jax.Array:
  return _product("rows", dtype)(lhs, rhs, group_sizes)


def _grouped_forward(lhs, rhs, group_sizes, dtype):
  return _grouped(lhs, rhs, group_sizes, dtype), (lhs, rhs, group_sizes)


def _grouped_backward(dtype, residuals, cotangent):
  lhs, rhs, group_sizes = residuals
  d_lhs = _product("rows_transposed", dtype)(cotangent, rhs, group_sizes)
  d_rhs = _product("groups", dtype)(lhs, cotangent, group_sizes)
  return d_lhs.astype(lhs.dtype), d_rhs.astype(rhs.dtype), None  # Sizes: integers.


_grouped.defvjp(_grouped_forward, _grouped_backward)


@functools.lru_cache(maxsize=None)
def _product(form: str, dtype: Any) -> custom_vmap:
  """The `form` product (`_FORMS`) in `dtype` (None: the operands'), batched by folding."""
  numbers = _FORMS[form]

  @custom_vmap
  def product(lhs, rhs, group_sizes):
    return jax.lax.ragged_dot_general(lhs, rhs, group_sizes, numbers,
                                      preferred_element_type=dtype)

  @product.def_vmap
  def folded(axis_size, in_batched, lhs, rhs, group_sizes):
    # The folded product is `product` itself, not the primitive: an outer vmap folds it again.
    lhs, rhs, group_sizes = (a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))
                             for a, batched in zip((lhs, rhs, group_sizes), in_batched))
    if axis_size == 1:
      return product(lhs[0], rhs[0], group_sizes[0])[None], True
    rows = lhs.shape[1]
    sizes = _with_rest(group_sizes, rows).reshape(-1)
    if form == "groups":
      out = product(lhs.reshape(-1, lhs.shape[2]), rhs.reshape(-1, rhs.shape[2]), sizes)
      return out.reshape(axis_size, -1, *out.shape[1:])[:, :-1], True
    padding = jnp.zeros((axis_size, 1, *rhs.shape[2:]), rhs.dtype)
    weights = jnp.concatenate([rhs, padding], axis=1).reshape(-1, *rhs.shape[2:])
    out = product(lhs.reshape(-1, lhs.shape[2]), weights, sizes)
    return out.reshape(axis_size, rows, -1), True
  return product


def _with_rest(group_sizes: jax.Array, rows: int) -> jax.Array:
  """[B, G + 1]: each member's group sizes cut at its `rows` rows (a group past them is cut
  as `ragged_dot` cuts it, never spilling into the next member's rows), and the rest of its
  rows as group G."""
  ends = jnp.minimum(jnp.cumsum(group_sizes, axis=1), rows)
  ends = jnp.concatenate([ends, jnp.full((ends.shape[0], 1), rows, ends.dtype)], axis=1)
  return jnp.diff(ends, axis=1, prepend=jnp.zeros((ends.shape[0], 1), ends.dtype))
