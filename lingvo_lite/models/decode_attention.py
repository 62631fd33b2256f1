"""TPU decode attention: one new token per slot over only the cache entries its slot filled.

A decode step's attention reads every slot's cached keys and values. Written out (the einsum
path of `layers.Attention._cached_attention`), it reads the whole cache, stale entries and
padding included, then masks; the Pallas paged-attention kernel that ships with JAX
(`jax.experimental.pallas.ops.tpu.paged_attention`, the kernel MaxText decodes with) copies
into the TPU's vector memory only the pages that hold a slot's first `length` entries and
keeps the running softmax there, so the step reads what it must and nothing else.

The cache needs no second layout. The kernel takes pages [kv_heads, pages, page_size, d] and
a table of which pages make each sequence; one layer's cache [slots, kv_heads, entries, d]
is already, by a free reshape, [1, slots * kv_heads * entries / page_size, page_size, d]:
every (slot, key/value head) pair becomes one sequence of single-head pages, its query heads
the group that shares that head, and the page table is arange. Rules:

- One query token per slot (a decode step). A prefill's many tokens take the training path.
- The entries a query sees must be a prefix of its slot's entries (`Attention._cache_prefix`
  says how many): positions 0..p, or all of a full ring of a sliding window (which keys sit
  where in the ring does not change a softmax over them).
- bfloat16 caches only: the kernel multiplies in bfloat16, so a float32 cache (a CPU run's)
  keeps the exact written-out path.
- Head dimensions of a multiple of 128 (the TPU's lane width: Mosaic refuses the kernel's
  blocks otherwise): Llama 3 8B's, Mistral's, Qwen3's. A head of 64 (SmolLM2, Llama 3.2 1B)
  keeps the written-out path.
- Page size: the largest of 128, 64, 32 and 16 that divides the entries (none: the written-out
  path); each of the kernel's blocks takes up to 512 entries. These follow the kernel's own
  tests and MaxText's defaults; they are not tuned on a chip yet.
- Meshes: like the training kernel (models/flash_attention.py), placed per shard with
  `jax.shard_map` over the slots' and the heads' mesh axes.
- Platforms: compiled by Mosaic on a TPU (an AOT compile for a TPU from this host included);
  interpreted anywhere else, which is what the CPU tests compare against the einsum path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lingvo_lite.models import flash_attention
from lingvo_lite.target import current_platform

PAGE_SIZES = (128, 64, 32, 16)
# The TPU's vector lane count: the kernel's blocks end in a whole number of lanes.
LANES = 128
# Entries per kernel block at most (pages_per_compute_block x page size).
BLOCK_ENTRIES = 512


def page_size(entries: int) -> int | None:
  """The page size for a slot of `entries`, or None where none of PAGE_SIZES divides it."""
  return next((size for size in PAGE_SIZES if entries % size == 0), None)


def supports(query_length: int, entries: int, head_dim: int, dtype: jnp.dtype) -> bool:
  """Whether a cached attention of `query_length` tokens over `entries` of `head_dim` in
  `dtype` has the kernel's form (the module docstring's rules)."""
  return (query_length == 1 and jnp.dtype(dtype) == jnp.bfloat16 and head_dim % LANES == 0
          and page_size(entries) is not None)


def _pages_per_block(pages: int, size: int) -> int:
  """The largest count of pages that divides a sequence's `pages` and spans at most
  BLOCK_ENTRIES (the kernel needs a divisor)."""
  most = max(1, BLOCK_ENTRIES // size)
  return max(count for count in range(1, min(pages, most) + 1) if pages % count == 0)


def attend(q: jax.Array, keys: jax.Array, values: jax.Array, lengths: jax.Array,
           interpret: bool | None = None) -> jax.Array:
  """softmax(q k^T) v over each slot's first `lengths` entries.

  Args:
    q: [slots, kv_heads, group, d], already scaled: the group of query heads sharing each
      key/value head.
    keys, values: One layer's cache, [slots, kv_heads, entries, d].
    lengths: int32 [slots], the entries each slot's query sees (at least 1).
    interpret: Defaults to "not on a TPU" (the active target's platform).

  Returns:
    [slots, kv_heads, group, d] in q's dtype.
  """
  entries = keys.shape[2]
  size = page_size(entries)
  if size is None:
    raise ValueError(f"paged decode attention needs entries divisible by {PAGE_SIZES[-1]}, "
                     f"got {entries}")
  if interpret is None:
    interpret = current_platform() != "tpu"

  # Imported here, not with this module: Pallas's TPU modules take 0.1 s to import, which
  # every process that never decodes with the kernel would pay.
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention  # pylint: disable=g-import-not-at-top

  def shard(q, keys, values, lengths):
    slots, kv_heads, group, head_dim = q.shape
    sequences, pages = slots * kv_heads, entries // size
    pages_of = lambda cache: cache.reshape(1, sequences * pages, size, head_dim)
    table = jnp.arange(sequences * pages, dtype=jnp.int32).reshape(sequences, pages)
    run = lambda: paged_attention(
        q.reshape(sequences, group, head_dim), pages_of(keys), pages_of(values),
        jnp.repeat(lengths.astype(jnp.int32), kv_heads), table,
        pages_per_compute_block=_pages_per_block(pages, size))
    if interpret:
      with pltpu.force_tpu_interpret_mode():
        out = run()
    else:
      # The kernel multiplies its float32 query and probabilities by the bfloat16 cache: Mosaic
      # compiles those mixed products at the default precision only (at "highest" it refuses
      # them, "Bad rhs type": seen on a v5e), where the MXU takes both operands as bfloat16.
      with jax.default_matmul_precision("default"):
        out = run()
    return out.reshape(slots, kv_heads, group, head_dim)

  specs = flash_attention.shard_specs(q.shape[0], keys.shape[1])
  if specs is not None:
    heads_spec, rows_spec = specs
    shard = jax.shard_map(shard, in_specs=(heads_spec, heads_spec, heads_spec,
                                           jax.sharding.PartitionSpec(rows_spec[0])),
                          out_specs=heads_spec, check_vma=False)
  return shard(q, keys, values, lengths)
