"""The written-out attention: scores as einsums, a masked softmax, the weighted values.

It runs everywhere, takes every mask (segments, a window, sinks), every length and head width,
and every decode step (any `_cache_mask` over the keys and values of every head): the row every
other kernel falls back to, and the reference the tests compare them with. It holds the
[rows, heads, length, length] float32 scores (measured fastest on CPUs all the same).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from lingvo_lite.models.attention_kernels.row import (HEADS, PLATFORMS, POSITIONS, Call,
                                                      DecodeForm, DecodeStep, Kernel)
from lingvo_lite.target import current_platform


def attention_mask(segment_ids: jax.Array | None, length: int) -> jax.Array:
  """Boolean [batch or 1, 1, 1, length, length] mask: causal, and within one segment."""
  causal = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))[None, None, None]
  if segment_ids is None:
    return causal
  same_segment = segment_ids[:, :, None] == segment_ids[:, None, :]
  return causal & same_segment[:, None, None]


def band_mask(length: int, window: int) -> jax.Array:
  """Boolean [1, 1, 1, length, length]: query i sees key j where 0 <= i - j < window."""
  index = jnp.arange(length, dtype=jnp.int32)
  offset = index[:, None] - index[None, :]
  return ((offset >= 0) & (offset < window))[None, None, None]


def unnormalized_softmax(logits: jax.Array, mask: jax.Array, sinks: jax.Array | None = None
                         ) -> tuple[jax.Array, jax.Array]:
  """exp(logits - max) over the keys where `mask` holds (0 elsewhere), and its sum.

  The caller divides the attention output by the sum instead of dividing the probabilities:
  [.., t, head_dim] values instead of [.., t, t], in the forward and the backward pass
  (measured: about 3% of a BenchSmall train step on 8 CPU devices). Every query sees at
  least itself, so the sum is at least 1. The un-normalized output is a sum over up to t
  values, so it is accumulated and divided in float32 (float16 would overflow).

  `sinks` (float32, broadcasting against logits without their key axis): a logit each
  query's softmax also sums over, with no value (gpt-oss's attention sinks): it enters the
  sum, and the shift, alone.
  """
  logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
  # The softmax does not depend on the shift, so no gradient flows through it.
  shift = jnp.max(logits, axis=-1, keepdims=True)
  if sinks is not None:
    shift = jnp.maximum(shift, sinks[..., None])
  shift = jax.lax.stop_gradient(shift)
  weights = jnp.exp(logits - shift)
  denominator = jnp.sum(weights, axis=-1)
  if sinks is not None:
    denominator = denominator + jnp.exp(sinks - shift[..., 0])
  return weights, denominator


def head_sinks(sinks: jax.Array | None, num_kv_heads: int, grouped: bool) -> jax.Array | None:
  """`sinks` [heads] laid out as the scores' [batch, heads, query] (or grouped: [batch,
  kv_heads, group, query]) for `unnormalized_softmax`."""
  if sinks is None:
    return None
  sinks = sinks.astype(jnp.float32)
  if grouped:
    return sinks.reshape(num_kv_heads, -1)[None, :, :, None]
  return sinks[None, :, None]


def layer_mask(layer: Any, segment_ids: jax.Array | None, length: int) -> jax.Array:
  """A layer's boolean mask [batch or 1, 1, 1, t, t]: causal, within a segment, within the
  layer's window (`sliding_window()`)."""
  mask = attention_mask(segment_ids, length)
  window = layer.sliding_window()
  return mask if window is None else mask & band_mask(length, window)


def attend(layer: Any, q: jax.Array, k: jax.Array, v: jax.Array,
           segment_ids: jax.Array | None, sinks: jax.Array | None = None) -> jax.Array:
  """Training's and prefill's attention, written out (the row's `attend`)."""
  batch, length = q.shape[:2]
  mask = layer_mask(layer, segment_ids, length)
  q = q * jnp.asarray(layer.scale(), layer.dtype)
  group = layer.num_heads // layer.num_kv_heads
  if group == 1:
    # Plain multi-head attention: 4-D einsums are measurably faster on CPU than the
    # grouped 5-D form with a unit group axis.
    logits = jnp.einsum("bthd,bshd->bhts", q, k).astype(jnp.float32)
    weights, denominator = unnormalized_softmax(
        logits, mask[:, :, 0], head_sinks(sinks, layer.num_kv_heads, False))
    out = jnp.einsum("bhts,bshd->bthd", weights.astype(layer.dtype), v,
                     preferred_element_type=jnp.float32)
    return (out / jnp.moveaxis(denominator, -1, 1)[..., None]).astype(layer.dtype)
  # Grouped-query: query heads grouped by the key/value head they share, so k and v are
  # never copied per query head: [b, t, kv_heads, group, d].
  q = q.reshape(batch, length, layer.num_kv_heads, group, layer.head_dim)
  logits = jnp.einsum("btkgd,bskd->bkgts", q, k).astype(jnp.float32)
  weights, denominator = unnormalized_softmax(logits, mask,
                                              head_sinks(sinks, layer.num_kv_heads, True))
  out = jnp.einsum("bkgts,bskd->btkgd", weights.astype(layer.dtype), v,
                   preferred_element_type=jnp.float32)
  out = (out / jnp.moveaxis(denominator, -1, 1)[..., None]).astype(layer.dtype)
  return out.reshape(batch, length, layer.num_heads, layer.head_dim)


# A decode step reads the cache in spans: the shortest of READ_SPAN x 1, 2, 4, ... entries (or
# all of them) that holds every entry its queries see. Reading the whole cache when the slots
# have filled a fraction of it is the step's largest waste once the layout tiles without
# padding (models/kv_cache.py): a server's cache is sized for its longest request. Doubling
# spans keep the branches few (log2 of the cache over 128) and the waste under 2x; 128 is the
# TPU's lane width, which the cache by position keeps its entries in.
READ_SPAN = 128


def read_spans(entries: int) -> tuple[int, ...]:
  """The spans a step over `entries` may read: READ_SPAN doubled while shorter, then all."""
  spans = []
  span = READ_SPAN
  while span < entries:
    spans.append(span)
    span *= 2
  return (*spans, entries)


def attend_cached(step: DecodeStep) -> jax.Array:
  """A decode step written out: the scores over the cache's entries, masked to those each
  query sees (the layer's `_cache_mask`). Reads either layout: "positions" split into its
  heads by a free reshape, the einsums then contract each layout's axes in place (no
  transpose is written).

  Where what the queries see is a prefix of each slot's entries (`_cache_prefix`), only the
  shortest span of `read_spans` that holds the longest slot's prefix is read (a `switch`
  over the spans, on the longest prefix of this step): entries past it are masked out
  anyway, so the result is the same."""
  entries = step.cache[0].shape[-2]
  spans = read_spans(entries)
  longest = step.positions.max(axis=1)  # A step's last query sees the most.
  seen = step.layer._cache_prefix(longest, entries)  # pylint: disable=protected-access
  if seen is None or len(spans) == 1:
    return _attend_span(step, entries)
  which = jnp.searchsorted(jnp.asarray(spans, jnp.int32), seen.max())
  return jax.lax.switch(which, [lambda span=span: _attend_span(step, span) for span in spans])


def _attend_span(step: DecodeStep, span: int) -> jax.Array:
  """`attend_cached` over the first `span` entries of every slot."""
  layer, q = step.layer, step.q
  keys, values = (jax.lax.slice_in_dim(x, 0, span, axis=x.ndim - 2) for x in step.cache)
  batch, length = q.shape[:2]
  entries = step.cache[0].shape[-2]
  cached = "bksd"
  if step.layout == POSITIONS:
    cached = "bskd"
    keys, values = (x.reshape(batch, span, layer.num_kv_heads, -1) for x in (keys, values))
  logits = jnp.einsum(f"btkgd,{cached}->bkgts", q, keys.astype(layer.dtype)).astype(jnp.float32)
  # The layer's hook (a family's subclass may see other entries), over every entry: a ring's
  # positions depend on its size.
  mask = layer._cache_mask(step.positions, entries)[..., :span]  # pylint: disable=protected-access
  mask = mask[:, None, None]
  weights, denominator = unnormalized_softmax(
      logits, mask, head_sinks(step.sinks, layer.num_kv_heads, True))
  # XLA:CPU has no bfloat16 x bfloat16 -> float32 dot of this shape for a few query
  # positions: there, float32 operands (the cache of one layer, converted as it is read).
  operands = jnp.float32 if current_platform() == "cpu" else layer.dtype
  out = jnp.einsum(f"bkgts,{cached}->btkgd", weights.astype(operands), values.astype(operands),
                   preferred_element_type=jnp.float32)
  out = (out / jnp.moveaxis(denominator, -1, 1)[..., None]).astype(layer.dtype)
  return out.reshape(batch, length, layer.num_heads, layer.head_dim)


def _keeps(call: Call) -> str:
  """By position, where a TPU tiles few narrow heads without padding (models/kv_cache.py); by
  head on a CPU, where XLA:CPU's decode step over positions was 1.5x (8 slots) to 2.6x (64)
  slower (tiny GPT-J, 4 heads of 64, 256 entries; bench/results/2026-12-07/
  decode_layout_aot.txt)."""
  return HEADS if call.platform == "cpu" else POSITIONS


ROW = Kernel(
    name="einsum",
    description="the attention written out (any platform, mask, length and decode step; "
                "holds the scores; the fastest on CPUs)",
    platforms=PLATFORMS, auto_on=PLATFORMS, holds_scores=True, attend=attend, value_width=True,
    decode=DecodeForm(layouts=(POSITIONS, HEADS), attend=attend_cached, keeps=_keeps),
    decode_fallback=None)
