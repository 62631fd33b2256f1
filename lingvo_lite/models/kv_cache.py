"""The key/value cache of a decoding transformer: every layer's keys and values by position.

One array each for keys and values, [layers, slots, kv_heads, cache_length, head_dim], for
scanned and unrolled layers alike (the model takes a layer's slice of either). A slot is one
row of the decode batch: it holds one request's positions from 0, so slots fill and empty
independently and a finished slot can take a new request (prefill writes its prompt from
index 0; each generated token's keys and values are written by the attention layers at the
slot's own next index, models/layers.py). Entries past a token's position are stale and
never attended to.

The axes have logical names, so the partitioner shards the cache as it shards activations:
slots over the data-parallel axes (`batch`), key/value heads over `tensor` (`heads`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from lingvo_lite.models.transformer import TransformerLM

AXES = ("layers", "batch", "heads", "length", "kv")


class KVCache(NamedTuple):
  """Keys and values of every layer, [layers, slots, kv_heads, cache_length, head_dim]."""

  keys: jax.Array
  values: jax.Array


def shape(model: TransformerLM, slots: int, cache_length: int) -> tuple[int, ...]:
  return (model.num_layers, slots, model.resolved_num_kv_heads, cache_length,
          model.resolved_head_dim)


def abstract(model: TransformerLM, slots: int, cache_length: int) -> KVCache:
  """The cache as shapes (for AOT compiles and shardings)."""
  leaf = jax.ShapeDtypeStruct(shape(model, slots, cache_length), jnp.dtype(model.dtype))
  return KVCache(leaf, leaf)


def logical_specs() -> KVCache:
  return KVCache(PartitionSpec(*AXES), PartitionSpec(*AXES))


def num_bytes(model: TransformerLM, slots: int, cache_length: int) -> int:
  """Bytes of the whole cache (keys and values), before sharding."""
  return 2 * math.prod(shape(model, slots, cache_length)) * np.dtype(model.dtype).itemsize


def write_prefix(cache: KVCache, new: tuple[jax.Array, jax.Array], slots: jax.Array
                 ) -> KVCache:
  """Writes a prefill's keys and values [layers, slots, t, kv_heads, head_dim] at indices
  [0, t) of the slots where `slots` (bool [slots]) holds; the other slots keep theirs."""
  def write_one(cached: jax.Array, update: jax.Array) -> jax.Array:
    length = update.shape[2]
    update = jnp.swapaxes(update, 2, 3).astype(cached.dtype)
    keep = cached[:, :, :, :length]
    chosen = jnp.where(slots[None, :, None, None, None], update, keep)
    return cached.at[:, :, :, :length].set(chosen)
  return KVCache(*(write_one(c, u) for c, u in zip(cache, new)))
