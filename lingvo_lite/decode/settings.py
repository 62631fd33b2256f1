"""The `decode` part of a Setup: how `--mode=decode` (and the AOT compile of decode) runs.

  --fdl.decode.slots=16 --fdl.decode.max_new_tokens=64 --fdl.decode.temperature=0.7

The slots and the cache length fix the shapes of the compiled decode functions; the prompt
is padded up to the smallest prefill bucket that holds it, so prompts of many lengths share
a few compiled prefills. The sampling fields are defaults that each request may override.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

from lingvo_lite.decode.sampling_checks import check_sampling
from lingvo_lite.errors import config_error
from lingvo_lite.fields import Int32Size, NonNegativeFloat, NonNegativeInt, PositiveInt, Range

Probability = Annotated[float, Range(0, 1, low_open=True, note="1 turns top-p off")]
# The smallest prefill bucket of the default ladder: shorter prompts pad up to it.
_SMALLEST_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """Decode batch and cache shapes, and the default sampling of a request.

  Attributes:
    slots: Requests decoded at once (the decode batch); a finished slot takes the next
      request. Split over the data-parallel mesh axes.
    cache_length: Positions a request may reach: its prompt and new tokens together fit in
      them (the model's family keeps their keys and values in its cache: all of them, or only
      the most recent ones it attends to). None: model.max_length (the model's context).
    prefill_buckets: Prompt lengths the prefill is compiled for, ascending; a prompt is padded
      to the smallest that holds it. None: powers of two from 16, and cache_length.
    max_new_tokens: Tokens to generate per request, unless the request says.
    temperature: 0 is greedy (argmax); otherwise logits are divided by it before sampling.
    top_k: Sample among the k most probable tokens; 0 turns it off.
    top_p: Sample among the most probable tokens that together reach this probability
      (nucleus sampling); 1 turns it off. Applied after temperature and top-k, as Hugging
      Face's `generate` applies them.
    seed: A request's seed, unless it gives one: its draws depend on it alone.
    stop: Stop strings: a completion ends where its text first contains one, and is cut
      before it.
    stop_at_eos: End a completion at the vocabulary's end-of-sequence token.
    steps_per_call: Tokens each slot generates per call of the jitted loop before the host
      looks for stop strings and refills finished slots.
  """

  slots: Annotated[int, Int32Size] = 8
  cache_length: Annotated[int, Int32Size] | None = None
  prefill_buckets: tuple[PositiveInt, ...] | None = None
  max_new_tokens: PositiveInt = 128
  temperature: NonNegativeFloat = 0.0
  top_k: NonNegativeInt = 0
  top_p: Probability = 1.0
  seed: Annotated[int, Range(0, 2**63 - 1)] = 0
  stop: tuple[str, ...] = ()
  stop_at_eos: bool = True
  steps_per_call: Annotated[int, Int32Size] = 32

  def resolved_cache_length(self, max_length: int) -> int:
    return self.cache_length or max_length

  def resolved_buckets(self, max_length: int) -> tuple[int, ...]:
    cache_length = self.resolved_cache_length(max_length)
    if self.prefill_buckets is not None:
      return tuple(self.prefill_buckets)
    ladder, size = [], _SMALLEST_BUCKET
    while size < cache_length:
      ladder.append(size)
      size *= 2
    return tuple(ladder) + (cache_length,)

  def bucket_for(self, prompt_length: int, max_length: int) -> int | None:
    """The smallest bucket that holds `prompt_length` tokens, or None if none does."""
    return next((b for b in self.resolved_buckets(max_length) if b >= prompt_length), None)

  def validate(self, max_length: int) -> None:
    """Cross-field checks (each field's own range is checked from its annotation)."""
    cache_length = self.resolved_cache_length(max_length)
    if cache_length > max_length:
      raise config_error("decode.cache_length", self.cache_length,
                         f"exceeds model.max_length={max_length}, the model's context",
                         f"use at most {max_length}")
    if cache_length < 2:
      raise config_error("decode.cache_length", cache_length,
                         "holds no prompt token and a new one", "use at least 2")
    buckets = self.prefill_buckets
    if buckets is not None:
      if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in buckets):
        raise config_error("decode.prefill_buckets", buckets,
                           "must be prompt lengths: ints >= 1", "e.g. (16, 64, 256)")
      if not buckets or list(buckets) != sorted(set(buckets)):
        raise config_error("decode.prefill_buckets", buckets,
                           "must be distinct lengths in ascending order",
                           "e.g. (16, 64, 256)")
      if buckets[-1] > cache_length:
        raise config_error("decode.prefill_buckets", buckets,
                           f"a bucket exceeds decode.cache_length={cache_length}",
                           f"use lengths of at most {cache_length}")
    # The bounds a request's own settings meet (float32 and int32 ranges of the decode arrays).
    check_sampling("decode.", temperature=self.temperature, top_k=self.top_k,
                   top_p=self.top_p, max_new_tokens=self.max_new_tokens, seed=self.seed,
                   stop=self.stop)
