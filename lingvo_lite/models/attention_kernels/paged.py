"""The TPU's decode kernel: Pallas's paged attention over the entries each slot filled
(models/decode_attention.py, per shard).

A decode form only: one query token per slot, over a bfloat16 cache of the keys and values of
every head ("heads" layout), heads of a multiple of 128, entries a page divides, and entries
a query sees that are a prefix of its slot's (`Attention._cache_prefix`); other steps are
written out. It has no training form: named, training and prefill are written out (splash's
row decodes through this one). Interpreted off a TPU; a GPU cannot run it.
"""

from __future__ import annotations

from lingvo_lite.models import decode_attention
from lingvo_lite.models.attention_kernels.row import HEADS, Call, DecodeForm, DecodeStep, Kernel


def _prefix(step: DecodeStep):
  """How many leading entries each slot's single query sees (the layer's hook), or None."""
  entries = step.cache[0].shape[-2]
  return step.layer._cache_prefix(step.positions[:, 0], entries)  # pylint: disable=protected-access


def fits(step: DecodeStep) -> bool:
  keys = step.cache[0]
  return (_prefix(step) is not None
          and decode_attention.supports(step.q.shape[1], keys.shape[-2], keys.shape[-1],
                                        keys.dtype))


def keeps(call: Call) -> str | None:
  """A model's steps are the kernel's where its cache is bfloat16 of heads a multiple of 128
  (a step may still not fit: `fits`): its cache is then by head, the kernel's pages; else
  the written-out form decodes it."""
  if call.dtype == "bfloat16" and call.head_dim % decode_attention.LANES == 0:
    return HEADS
  return None


def attend(step: DecodeStep):
  """The kernel over each slot's filled entries: reads only those."""
  layer, q = step.layer, step.q
  keys, values = step.cache
  batch, length = q.shape[:2]
  out = decode_attention.attend(q[:, 0], keys, values, _prefix(step))
  return out.reshape(batch, length, layer.num_heads, layer.head_dim)


ROW = Kernel(
    name="paged",
    description="Pallas's paged-attention decode kernel for TPUs (one token per slot over a "
                "bfloat16 cache, heads a multiple of 128; no training form)",
    platforms=("tpu",), interpreted_on=("cpu",),
    decode=DecodeForm(layouts=(HEADS,), attend=attend, fits=fits, keeps=keeps))
