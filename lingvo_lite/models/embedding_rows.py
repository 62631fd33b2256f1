"""The embedding lookup's rows, from the table gathered whole in the compute dtype.

A model gathers its embedding table whole before the lookup, as FSDP gathers every weight
(models/transformer.py says why). Gathered in the parameters' float32, that copy is a
vocab x dim float32 buffer on every device: 3.45 GiB for DeepSeek-V3's 129,280 x 7,168, kept
through the step (bench/results/2026-12-07/deepseek/compile_verdicts.md). The rows are used
in the compute dtype, and rounding a row before or after the gather gives the same numbers,
so the table is cast first and the gathered copy is half as large in bfloat16.

Left to autodiff, the cast would move the backward pass's scatter-add into the compute dtype
too (bfloat16 sums of a frequent token's many rows). The backward here is the float32 one of
a lookup in float32: each row's cotangent in float32, scatter-added into a float32 table, so
the gradient equals the plain `jnp.take(table, tokens).astype(dtype)`'s exactly.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from lingvo_lite.models import layers
from lingvo_lite.models import quantization as quantizing


def lookup(embedding: Any, tokens: jax.Array, dtype: jnp.dtype) -> jax.Array:
  """The rows of `embedding` (a float table, or an int8 one under "int8_weights") for
  `tokens`, in `dtype`, from the table gathered whole: [*tokens.shape, dim]."""
  if quantizing.is_quantized(embedding):  # Already its narrowest: gathered as it is.
    return quantizing.take_rows(jax.tree.map(lambda a: layers.constrain(a, None, None),
                                             embedding), tokens, dtype)
  return take_rows(embedding, tokens, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def take_rows(table: jax.Array, tokens: jax.Array, dtype: jnp.dtype) -> jax.Array:
  """`table[tokens]` in `dtype` (a float `table` [vocab, dim], gathered whole in `dtype`):
  [*tokens.shape, dim]."""
  return _forward(table, tokens, dtype)


def _forward(table: jax.Array, tokens: jax.Array, dtype: jnp.dtype) -> jax.Array:
  whole = layers.constrain(table.astype(dtype), None, None)
  return jnp.take(whole, tokens, axis=0)


def _take_fwd(table, tokens, dtype):
  # The table itself is a parameter, live through the step anyway; no gathered copy is kept.
  return _forward(table, tokens, dtype), (table, tokens)


def _take_bwd(dtype, saved, cotangent):
  del dtype
  table, tokens = saved
  rows = cotangent.astype(table.dtype).reshape(-1, table.shape[-1])
  grad = jnp.zeros(table.shape, table.dtype).at[tokens.reshape(-1)].add(rows)
  # Whole, as the transpose of the float32 lookup's gather from the whole table builds it.
  return layers.constrain(grad, None, None), None


take_rows.defvjp(_take_fwd, _take_bwd)
