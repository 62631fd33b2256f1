"""A decode request resolved before any device time: its settings from the config's `decode.*`
defaults and its own overrides, its prompt as ids, and its length checked against the decode
cache and the prefill buckets (a request that does not fit is one line naming what to shrink).
Needs no device: decode, the server and the harness resolve every request first.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from lingvo_lite.decode.requests import Request
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup


class DoesNotFit(UsageError):
  """A request longer than the decode cache holds (one line, as any UsageError).

  Attributes:
    field: The request field that must shrink: `max_new_tokens` when the prompt alone fits
      (with room for a token), else `prompt`. A caller with other names for them (the
      server's `max_tokens`, `messages`) names the field its client gave.
  """

  def __init__(self, message: str, field: str):
    super().__init__(message)
    self.field = field


@dataclasses.dataclass(frozen=True)
class Resolved:
  """A request with every setting decided and its prompt as ids."""

  index: int
  request: Request
  prompt_ids: tuple[int, ...]
  prompt_text: str | None
  max_new_tokens: int
  temperature: float
  top_k: int
  top_p: float
  seed: int
  stop: tuple[str, ...]

  @property
  def settings(self) -> dict[str, Any]:
    return {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
            "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed, "stop": self.stop}


class RequestResolver:
  """Turns requests into jobs for the slots: settings from the config's `decode.*` defaults,
  the prompt as ids, and the lengths checked against the cache. Needs no device."""

  def __init__(self, setup: Setup, vocabulary: Any = None):
    self.model = setup.model
    self.settings = setup.decode
    self.vocabulary = vocabulary
    self.cache_length = self.settings.resolved_cache_length(self.model.max_length)

  def resolve(self, index: int, request: Request) -> Resolved:
    """The request with the config's defaults filled in and its prompt as ids.

    Raises:
      UsageError: one line naming the request (its source) and the problem.
    """
    settings = self.settings
    given = request.overrides()
    where = f"{request.source}: "
    if request.prompt is not None:
      if self.vocabulary is None:
        raise UsageError(f"{where}prompt: this experiment's data has no text vocabulary "
                         "(its ids are not text); give prompt_ids (in a --prompts_file line)")
      ids = tuple(int(i) for i in self.vocabulary.encode(request.prompt))
      if not ids:
        raise UsageError(f"{where}prompt={request.prompt!r}: tokenizes to no token; give "
                         "some text")
      text = request.prompt
    else:
      ids = tuple(request.prompt_ids)
      text = self.text(ids)
    bad = [i for i in ids if not 0 <= i < self.model.vocab_size]
    if bad:
      raise UsageError(f"{where}prompt_ids: token id {bad[0]} is outside the model's "
                       f"vocabulary [0, {self.model.vocab_size}); give ids below "
                       f"model.vocab_size={self.model.vocab_size}")
    max_new = given.get("max_new_tokens", settings.max_new_tokens)
    largest_bucket = settings.resolved_buckets(self.model.max_length)[-1]
    if len(ids) > largest_bucket or len(ids) + max_new > self.cache_length:
      prompt_fits = len(ids) <= largest_bucket and len(ids) < self.cache_length
      raise DoesNotFit(f"{where}the prompt's {len(ids)} tokens and max_new_tokens={max_new} "
                       f"do not fit the decode cache (decode.cache_length={self.cache_length}"
                       f", longest prefill bucket {largest_bucket}); "
                       + self._fit_fixes(len(ids), max_new, largest_bucket),
                       "max_new_tokens" if prompt_fits else "prompt")
    stop = tuple(given.get("stop", settings.stop))
    if stop and self.vocabulary is None:
      named = "stop" if "stop" in given else "decode.stop"
      raise UsageError(f"{where}{named}={list(stop)!r}: stop strings are matched in the "
                       "text, and this experiment's data has no text vocabulary; drop them "
                       "(stop: [] in a --prompts_file line) or use max_new_tokens")
    return Resolved(
        index=index, request=request, prompt_ids=ids, prompt_text=text,
        max_new_tokens=max_new,
        temperature=float(given.get("temperature", settings.temperature)),
        top_k=int(given.get("top_k", settings.top_k)),
        top_p=float(given.get("top_p", settings.top_p)),
        seed=int(given.get("seed", settings.seed)), stop=stop)

  def _fit_fixes(self, prompt_length: int, max_new: int, largest_bucket: int) -> str:
    """The changes that would make a request fit, only those that can."""
    fixes = []
    longest_prompt = min(largest_bucket, self.cache_length - max_new)
    if longest_prompt > 0:
      fixes.append(f"shorten the prompt to at most {longest_prompt} tokens")
    if prompt_length <= largest_bucket and self.cache_length - prompt_length > 0:
      fixes.append(f"lower max_new_tokens to at most {self.cache_length - prompt_length}")
    context = self.model.max_length
    if self.cache_length < context:
      fixes.append(f"raise --fdl.decode.cache_length (up to model.max_length={context}, the "
                   "model's context)")
    if prompt_length > largest_bucket and largest_bucket < self.cache_length:
      fixes.append(f"add a prefill bucket of at least {prompt_length} "
                   "(--fdl.decode.prefill_buckets)")
    if not fixes:
      fixes.append(f"shorten the prompt: the model's context is model.max_length={context}")
    return ", or ".join(fixes)

  def text(self, ids: Sequence[int]) -> str | None:
    """The text of `ids` (None without a text vocabulary). EOS ids are dropped, not ends:
    seqio's decode stops at the first, which would lose what follows when
    `decode.stop_at_eos` is off."""
    if self.vocabulary is None:
      return None
    eos = getattr(self.vocabulary, "eos_id", None)
    pieces, current = [], []
    for token in ids:
      if token == eos:
        pieces.append(current)
        current = []
      else:
        current.append(int(token))
    pieces.append(current)
    return "".join(self.vocabulary.decode(piece) for piece in pieces if piece)

  def completion_text(self, prompt_ids: Sequence[int], ids: Sequence[int]) -> str | None:
    """The text `ids` add after the prompt: the text of prompt + ids past the prompt's own,
    so a character whose bytes straddle the two, or a tokenizer's leading-space rule, comes
    out as in the whole; the completion's own text where the prompt's is not a prefix."""
    if self.vocabulary is None:
      return None
    whole, prompt = self.text(list(prompt_ids) + list(ids)), self.text(prompt_ids)
    return whole[len(prompt):] if whole.startswith(prompt) else self.text(ids)
