"""The key/value cache of a decoding transformer: every layer's keys and values by position.

`TransformerLM`'s decode-cache methods (the family interface, models/family.py) are built from
these functions, over the model's `CacheArray`s: which layers each array holds and how many
entries a slot has there.

Per layer, keys and values are in one of two layouts (`HEADS`, `POSITIONS`, the model's
`cache_layout()`): [slots, kv_heads, entries, head_dim], or [slots, entries, kv_heads *
head_dim]. A full-attention layer
holds `cache_length` entries (position p at entry p); a sliding-window layer holds
min(window, cache_length), a ring (position p at entry p % entries: decoding past the window
writes over the positions that fell out of it, so that layer's memory stays the window's
however long a request runs). Layers are grouped into arrays as they are computed:

- unrolled layers: one array per layer, of that layer's entries;
- scanned layers of one kind: one stacked array [layers, slots, ...] (the scan carries it and
  updates its layer's slice);
- scanned layers of a repeating pattern of kinds (models/transformer.py scans groups of the
  pattern's length, the layers left over unrolled): one stacked array per position in the
  pattern, [groups, slots, ...] of that position's entries, and one array per layer left over.

Separate arrays let each layer's attention read and write its own in place: slices of one
stacked array made XLA:CPU copy them every step (measured: 4.3 ms against 0.6 ms for four
layers' writes and reads at 8 slots x 288 positions).

A slot is one row of the decode batch: it holds one request's positions from 0, so slots
fill and empty independently and a finished slot can take a new request (prefill writes its
prompt; each generated token's keys and values are written by the attention layers at the
slot's own next entry, models/layers.py). Entries past a token's position are stale and never
attended to.

The axes have logical names, so the partitioner shards the cache as it shards activations:
slots over the data-parallel axes (`batch`), key/value heads over `tensor` (`heads`; in
"positions" the merged heads and width, whole heads where the mesh divides the heads).

What an entry holds is the model's `cache_widths()`: (heads, key width, value width), the
key/value heads and head width here; latent attention's (models/latent_attention.py) is one
"head" of its latent (as keys) and its rotary key (as values), unsharded over heads
(`cache_axes()`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from lingvo_lite.models.attention_kernels.row import HEADS, POSITIONS
from lingvo_lite.models.family import ArrayShape

# The layouts an array of keys (or values) may have (`HEADS`, `POSITIONS`: named with the
# kernels' decode forms, which say which they read); a model says which its own has
# (`cache_layout()`, models/attention_kernels: `cache_layout`). "heads": [slots, heads,
# entries, width], each head's entries contiguous (what the TPU's paged decode kernel reads,
# page by page per head). "positions": [slots, entries, heads * width], every head of an
# entry together: XLA:TPU tiles an array's two minor dimensions by (8, 128) in its decode
# loop, and in "heads" it kept (heads, width) minor: SmolLM2's 3 heads of 64 padded to 4 x
# 128, so every read of the cache moved 2.67x its bytes (the optimized HLO of the loop,
# bench/results/2026-12-07/decode_layout_aot.txt). Any other layout name (a family's own, as
# latent attention's "latent") is stored as "heads".
# Each layout's logical axes: slots over the data-parallel axes, heads over `tensor` (merged
# with their width, a mesh that divides the heads, which the key projection's check ensures,
# splits whole heads).
AXES = {HEADS: ("batch", "heads", "length", "kv"), POSITIONS: ("batch", "length", "heads")}
# And in words (the decode compile report's).
DIMENSIONS = {HEADS: ("slots", "kv_heads", "entries", "head_dim"),
              POSITIONS: ("slots", "entries", "kv_heads * head_dim")}


class KVCache(NamedTuple):
  """Keys and values: tuples with one array per `CacheArray` of the model, each in the model's
  layout (`AXES`), or [layers, ...] of it when stacked."""

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]


@dataclasses.dataclass(frozen=True)
class CacheArray:
  """One array of the cache (and the same for values): the layers it holds and their entries.

  Attributes:
    layers: The model's layers it holds, in order; stacked on a leading axis if `stacked`.
    entries: Entries per slot: the cache length, or a sliding window's (at most the length).
    ring: Its layers keep a ring of the last `entries` positions (a sliding window).
    stacked: A leading axis of `layers` (scanned layers); else it holds one layer.
    kind: The layers' attention kind (for shapes' names).
  """

  layers: tuple[int, ...]
  entries: int
  ring: bool
  stacked: bool
  kind: str = "full"


def ring_positions(last: jax.Array, entries: int) -> jax.Array:
  """The position each of a ring's `entries` holds once positions up to `last` (int32
  [...]) are written in order, position p at entry p % entries: [..., entries]. Negative
  where nothing of this request is there yet (a stale entry)."""
  last = last[..., None]
  return last - (last - jnp.arange(entries, dtype=jnp.int32)) % entries


def _stored_as(layout: str) -> str:
  """The order a layout's arrays are in ("heads" for a family's own layout)."""
  return POSITIONS if layout == POSITIONS else HEADS


def axes(layout: str) -> tuple[str, ...]:
  """The logical axes of one layer's keys (or values) in `layout`."""
  return AXES[_stored_as(layout)]


def dimensions(layout: str, stacked: bool = False) -> tuple[str, ...]:
  """The dimensions of an array of `layout` in words, a stack's layers first."""
  return ("layers",) * stacked + DIMENSIONS[_stored_as(layout)]


def layer_shape(layout: str, slots: int, heads: int, entries: int, width: int
                ) -> tuple[int, ...]:
  """One layer's keys' (or values') shape in `layout`. Entries are the second last axis in
  every layout, slots the first."""
  if layout == POSITIONS:
    return (slots, entries, heads * width)
  return (slots, heads, entries, width)


def stored(update: jax.Array, layout: str) -> jax.Array:
  """Keys or values [..., t, heads, width] (as attention computes them) in `layout`'s order:
  [..., heads, t, width], or [..., t, heads * width]."""
  if layout == POSITIONS:
    return update.reshape(*update.shape[:-2], -1)
  return jnp.swapaxes(update, -3, -2)


def write_tokens(cached: jax.Array, update: jax.Array, entry: jax.Array, layout: str,
                 layer: Any = None) -> jax.Array:
  """A decode step's write: `update` [slots, t, heads, width] at entries `entry` (int32
  [slots, t]) of every slot, into one layer's array or, with `layer` (a traced index inside
  a scan), that layer's of a stack."""
  rows = jnp.arange(update.shape[0])[:, None]
  if layout == POSITIONS:
    # [rows, entry] indexes [slots, t, heads * width].
    where, update = (rows, entry), stored(update, layout)
  else:
    # [rows, :, entry]: the advanced indices are apart, so they index [slots, t, heads, width].
    where = (rows, slice(None), entry)
  if layer is not None:
    where = (layer, *where)
  return cached.at[where].set(update.astype(cached.dtype))


def _shapes(model: Any, entries: int, slots: int) -> tuple[tuple[int, ...], ...]:
  """One layer's keys' and values' shapes in the model's layout."""
  heads, key_width, value_width = model.cache_widths()
  layout = model.cache_layout()
  return tuple(layer_shape(layout, slots, heads, entries, width)
               for width in (key_width, value_width))


def _shape(model: Any, array: CacheArray, slots: int, part: int) -> tuple[int, ...]:
  shape = _shapes(model, array.entries, slots)[part]
  return (len(array.layers), *shape) if array.stacked else shape


def array_shapes(model: Any, arrays: Sequence[CacheArray], slots: int) -> list[ArrayShape]:
  """Every layer's keys and values as shapes: one `ArrayShape` per attention kind and entry
  count, with a repeat per layer (the same bytes and logical axes whether the layers are
  scanned or unrolled)."""
  layers_by_size: dict[tuple[str, int], int] = {}
  for array in arrays:
    key = (array.kind, array.entries)
    layers_by_size[key] = layers_by_size.get(key, 0) + len(array.layers)
  dtype = jnp.dtype(model.dtype)
  found = []
  for (kind, entries), count in layers_by_size.items():
    suffix = "" if len(layers_by_size) == 1 else f"[{kind}]"
    found += [ArrayShape(f"{name}{suffix}", model.cache_axes(), shape, dtype, repeats=count)
              for name, shape in zip(("keys", "values"), _shapes(model, entries, slots))]
  return found


def empty(model: Any, arrays: Sequence[CacheArray], slots: int) -> KVCache:
  """Zeros, a fresh buffer for each array (the state is donated, and one buffer given for
  two donated arguments is refused)."""
  dtype = jnp.dtype(model.dtype)
  return KVCache(*(tuple(jnp.zeros(_shape(model, array, slots, part), dtype)
                         for array in arrays) for part in range(2)))


def logical_specs(model: Any, arrays: Sequence[CacheArray]) -> KVCache:
  axes = model.cache_axes()
  specs = tuple(PartitionSpec("layers", *axes) if array.stacked else PartitionSpec(*axes)
                for array in arrays)
  return KVCache(specs, specs)


def _slot_mask(insert: jax.Array, cached: jax.Array, layout: str) -> jax.Array:
  """`insert` (bool [slots]) broadcast against `cached`'s layout (a stack's layers before)."""
  after = len(layer_shape(layout, 1, 1, 1, 1)) - 1
  return insert.reshape((1,) * (cached.ndim - after - 1) + (-1,) + (1,) * after)


def _write_positions(cached: jax.Array, update: jax.Array, insert: jax.Array,
                     layout: str) -> jax.Array:
  """`cached` [(layers,) ...] in `layout` <- update [(layers,) slots, t, heads, d] at entries
  [0, t) of the slots where `insert` (bool [slots]) holds; the other slots keep theirs."""
  update = stored(update, layout).astype(cached.dtype)
  window = (Ellipsis, slice(0, update.shape[-2]), slice(None))
  mask = _slot_mask(insert, cached, layout)
  return cached.at[window].set(jnp.where(mask, update, cached[window]))


def _write_ring(cached: jax.Array, update: jax.Array, lengths: jax.Array,
                insert: jax.Array, layout: str) -> jax.Array:
  """Each inserted slot's last min(entries, length) prompt positions of `update`
  [(layers,) slots, bucket, heads, d] at their ring entries of `cached` (in `layout`)."""
  entries, bucket = cached.shape[-2], update.shape[-3]
  held = ring_positions(lengths.astype(jnp.int32) - 1, entries)  # [slots, entries]
  lead = (1,) * (update.ndim - 4)
  index = jnp.clip(held, 0, bucket - 1).reshape(lead + held.shape + (1, 1))
  gathered = stored(jnp.take_along_axis(update, index, axis=-3), layout).astype(cached.dtype)
  # [slots, entries] as the layout's [..., slots, (heads,) entries, width].
  keep = (held >= 0) & insert[:, None]
  keep_new = keep.reshape(lead + (keep.shape[0],) + (1,) * (cached.ndim - len(lead) - 3)
                          + (entries, 1))
  return jnp.where(keep_new, gathered, cached)


def write_prefix(cache: KVCache, new: tuple[jax.Array, jax.Array], arrays: Sequence[CacheArray],
                 lengths: jax.Array, insert: jax.Array, layout: str = HEADS) -> KVCache:
  """Writes a prefill's keys and values [layers, slots, bucket, kv_heads, head_dim] (as the
  model returns them, every layer's) into the slots where `insert` (bool [slots]) holds: a
  full layer's at entries [0, bucket), a ring's last min(entries, length) prompt positions
  at their ring entries; the other slots keep theirs. `layout`: the cache's."""
  def write(cached: tuple[jax.Array, ...], update: jax.Array) -> tuple[jax.Array, ...]:
    written = []
    for array, held in zip(arrays, cached):
      layers = update[np.asarray(array.layers)] if array.stacked else update[array.layers[0]]
      written.append(_write_ring(held, layers, lengths, insert, layout) if array.ring
                     else _write_positions(held, layers, insert, layout))
    return tuple(written)

  return KVCache(*(write(c, u) for c, u in zip(cache, new)))
