"""The token embedding's lookup, whose gradient is built in the table's own shards.

The lookup gathers rows from the whole table (as FSDP gathers every weight before use: from a
sharded table XLA could not turn the gathered rows into batch-sharded activations
efficiently, and replicated them instead). Left to autodiff, the transpose of that gather was
a scatter-add into the whole table on every device, in the parameters' float32, then an
all-reduce of it: three buffers of the whole table a device (the zeros, the scatter-add, the
all-reduce), 3.45 GiB each for DeepSeek-V3's 129,280 x 7,168 (the largest of its step's
temporaries in a v5p compile of its v5e-256 x 8 mesh), 1000 MiB each for MaxText32B's.

Here the backward pass is placed per shard (`jax.shard_map` over the mesh), where the
gradient lives: the rows' gradients, split by the batch, are exchanged over the mesh axes
that split the table's width (an all-to-all: each device keeps its slice of the width for
the rows of every device of those axes, the same bytes it had), the tokens gathered alike,
and each device adds them into its own shard of the table (its rows of the vocabulary where
`vocab` is split too: other tokens are dropped there); a batch split over other axes as well
is summed over them (a shard of the table each). Where the mesh lies otherwise (the width on
an axis the batch is not split over), the plain scatter-add, as autodiff's.

The rows are gathered from the table cast to the compute dtype first: casting the rows after
the gather gives the same values, and the whole table the gather reads is half the bytes in
bfloat16 (XLA:TPU does not move a cast after the gather before it by itself for a v5e: on
v5e-256 x 8 the float32 gather and its receive buffer across slices were the two largest
allocations, 3.46 GiB each, once the backward was per shard). Neither half alone helped
there; with the all-to-all dispatch, both (and the barrier below) let XLA:TPU compile
DeepSeek-V3's step for v5e-256 x 8 (bench/results/2026-12-07/deepseek/compile_verdicts.md). The
gradient is autodiff's sum, in float32, cast to the table's dtype.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.models import mesh_axes


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def rows(table: jax.Array, tokens: jax.Array, dtype: jnp.dtype) -> jax.Array:
  """`table[tokens]` in `dtype`, tokens [batch, length] -> [batch, length, dim], gathered from
  the whole table."""
  # The barrier keeps the cast before the gather: across a multi-slice mesh XLA:TPU otherwise
  # gathers the float32 table over the slices and casts after (v5e-256 x 8: a 3.46 GiB
  # receive buffer, the step's largest).
  whole = nn.with_logical_constraint(jax.lax.optimization_barrier(table.astype(dtype)),
                                     (None, None))
  return jnp.take(whole, tokens, axis=0)


def _rows_forward(table, tokens, dtype):
  return rows(table, tokens, dtype), (table, tokens)


def _rows_backward(dtype, residuals, cotangent):
  del dtype
  table, tokens = residuals
  vocab_size, dim = table.shape
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return _added(vocab_size, tokens, cotangent, 0).astype(table.dtype), None
  batch = mesh_axes.split_over("batch", tokens.shape[0], mesh)
  width = mesh_axes.split_over("embed", dim, mesh)
  vocab = mesh_axes.split_over("vocab", vocab_size, mesh)
  if not set(width) <= set(batch) or set(vocab) & set(batch + width):
    return _added(vocab_size, tokens, cotangent, 0).astype(table.dtype), None
  spec = mesh_axes.spec
  summed = tuple(axis for axis in batch if axis not in width)
  per_shard = functools.partial(_per_shard, width, vocab, summed,
                                vocab_size // mesh_axes.ways(vocab, mesh))
  run = jax.shard_map(per_shard, in_specs=(spec(batch, ()), spec(batch, (), ())),
                      out_specs=spec(vocab, width), check_vma=False)
  return run(tokens, cotangent).astype(table.dtype), None  # The tokens are integers.


rows.defvjp(_rows_forward, _rows_backward)


def _per_shard(width: tuple[str, ...], vocab: tuple[str, ...], summed: tuple[str, ...],
               local_vocab: int, tokens: jax.Array, cotangent: jax.Array) -> jax.Array:
  """One device's shard of the table's gradient [local_vocab, dim / width ways] from its rows'
  tokens [b, length] and gradients [b, length, dim]."""
  if width:
    # Each device's slice of the width for the rows of every device along `width`: in the
    # order all_gather stacks their tokens.
    cotangent = jax.lax.all_to_all(cotangent, width, split_axis=2, concat_axis=0, tiled=True)
    tokens = jax.lax.all_gather(tokens, width, axis=0, tiled=True)
  first = jax.lax.axis_index(vocab) * local_vocab if vocab else 0
  grads = _added(local_vocab, tokens, cotangent, first)
  return jax.lax.psum(grads, summed) if summed else grads


def _added(vocab_size: int, tokens: jax.Array, cotangent: jax.Array, first: jax.Array | int
           ) -> jax.Array:
  """The rows' gradients summed by token into [vocab_size, dim] float32, of the vocabulary's
  rows from `first` (a token outside them adds nothing)."""
  local = tokens - first
  local = jnp.where((local >= 0) & (local < vocab_size), local, vocab_size)  # Dropped.
  grads = jnp.zeros((vocab_size, cotangent.shape[-1]), jnp.float32)
  return grads.at[local].add(cotangent.astype(jnp.float32), mode="drop")
