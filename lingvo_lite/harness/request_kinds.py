"""lm-evaluation-harness's three request kinds, answered by a loaded model (serving/
loaded_model.py), with no lm_eval import: the lm_eval model (harness/lm_eval_model.py) is a
thin shell over these, and tests call them directly.

Tokenization follows lm_eval's API models (`local-completions` against our server, with the
server's /tokenize), so the in-process model and the server path score the same ids:

  - a (context, continuation) pair: trailing spaces of the context move to the continuation;
    the whole and the context are encoded, and the continuation is what the whole has past the
    context's ids; an empty context is the prefix token (BOS, else EOS) alone;
  - a sequence longer than the model's context is cut from the left, the context first;
  - a rolling document is scored in windows of the context less one (`get_rolling_token_windows`
    with context 1, made disjoint), each conditioned on the window before it.

Every sequence of a call is scored in one packed pass (scoring/scorer.py); results come back in
the order the requests came.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from lingvo_lite.decode.requests import Request
from lingvo_lite.errors import UsageError

# generate_until's settings (lm_eval's gen_kwargs) that map onto a decode request.
_GENERATION_KEYS = ("until", "max_gen_toks", "temperature", "do_sample", "top_p", "top_k",
                    "seed")


def split_pair(model: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
  """The ids of the context and of the continuation, as lm_eval's API models make them."""
  if not context:
    continuation_ids = model.encode(continuation)
    prefix = prefix_token(model)
    if continuation_ids and continuation_ids[0] == prefix:
      return continuation_ids[:1], continuation_ids[1:]
    return [prefix], continuation_ids
  spaces = len(context) - len(context.rstrip())
  if spaces:
    context, continuation = context[:-spaces], context[-spaces:] + continuation
  whole = model.encode(context + continuation)
  context_ids = model.encode(context)
  return context_ids, whole[len(context_ids):]


def prefix_token(model: Any) -> int:
  """The token an empty context is: BOS where the vocabulary has one, else EOS."""
  token = model.bos_id if model.bos_id is not None else model.eos_id
  if token is None:
    raise UsageError("loglikelihood of an empty context: the model's vocabulary has neither "
                     "BOS nor EOS to condition on; give a context")
  return int(token)


@dataclasses.dataclass(frozen=True)
class _Scored:
  ids: list[int]  # What is scored (the tokens fed, and the ones predicted).
  first: int  # The index in `ids` of the first token whose log-probability counts.


def _truncated(context: list[int], continuation: list[int], max_length: int) -> _Scored:
  ids = (context + continuation)[-max_length:]
  dropped = len(context) + len(continuation) - len(ids)
  return _Scored(ids=ids, first=max(1, len(context) - dropped))


def _sums(model: Any, scored: Sequence[_Scored]) -> list[tuple[float, bool]]:
  """(sum of log-probabilities of ids[first:], whether each is the argmax) per entry."""
  results = model.scorer.score([s.ids for s in scored], top=False)
  out = []
  for entry, scores in zip(scored, results):
    span = slice(entry.first - 1, len(entry.ids) - 1)  # Score index j is token j + 1.
    out.append((float(scores.logprobs[span].astype("float64").sum()),
                bool(scores.greedy[span].all())))
  return out


def _length(model: Any, max_length: int | None) -> int:
  """The longest sequence scored: the model's context unless a shorter one is asked for (an
  lm_eval client of the server leaves a position for the token it asks to generate)."""
  if max_length is None:
    return model.max_length
  if not 2 <= max_length <= model.max_length:
    raise UsageError(f"max_length={max_length}: give 2 to the model's context, "
                     f"model.max_length={model.max_length}")
  return max_length


def loglikelihood(model: Any, pairs: Sequence[tuple[str, str]],
                  max_length: int | None = None) -> list[tuple[float, bool]]:
  """(log p(continuation | context), whether greedy decoding gives it) per pair, each
  sequence cut from the left to `max_length` (default: the model's context)."""
  length = _length(model, max_length)
  scored, empty = [], []
  for index, (context, continuation) in enumerate(pairs):
    context_ids, continuation_ids = split_pair(model, context, continuation)
    if continuation_ids:
      scored.append(_truncated(context_ids, continuation_ids, length))
    else:
      # The whole tokenizes to no more ids than the context (a merge across the boundary):
      # nothing is scored, log 1 = 0, as lm_eval's API models answer it.
      empty.append(index)
  sums = iter(_sums(model, scored))
  return [(0.0, True) if index in empty else next(sums) for index in range(len(pairs))]


def rolling_windows(tokens: list[int], prefix: int, window: int) -> list[_Scored]:
  """Disjoint windows that predict every token of `tokens` once: the first from the prefix
  token, each later one conditioned on as many earlier tokens as fit in `window` + 1."""
  scored, predicted = [], 0
  while predicted < len(tokens):
    count = min(window, len(tokens) - predicted)
    end = predicted + count
    if predicted == 0:
      ids = [prefix] + tokens[:end]
    else:
      ids = tokens[max(0, end - window - 1):end]
    scored.append(_Scored(ids=ids, first=len(ids) - count))
    predicted = end
  return scored


def loglikelihood_rolling(model: Any, texts: Sequence[str],
                          max_length: int | None = None) -> list[float]:
  """Each text's total log-probability, longer texts scored in windows of `max_length`
  (default: the model's context) less one (see the module doc)."""
  window = _length(model, max_length) - 1
  windows, owners = [], []
  for index, text in enumerate(texts):
    parts = rolling_windows(model.encode(text), prefix_token(model), window)
    windows += parts
    owners += [index] * len(parts)
  totals = [0.0] * len(texts)
  for owner, (value, _) in zip(owners, _sums(model, windows)):
    totals[owner] += value
  return totals


def generation_request(model: Any, index: int, context: str,
                       settings: Mapping[str, Any], default_max_tokens: int) -> Request:
  """A decode request for lm_eval's (context, gen_kwargs): `until` as stop strings,
  `max_gen_toks` as max_new_tokens, greedy unless `do_sample`; the context cut from the left
  to leave room for the new tokens in the decode cache, as lm_eval's own models cut it."""
  unknown = sorted(set(settings) - set(_GENERATION_KEYS))
  if unknown:
    raise UsageError(f"generate_until: gen_kwargs {unknown[0]!r} is not one lingvo_lite "
                     f"decodes with; use {', '.join(_GENERATION_KEYS)}")
  until = settings.get("until") or ()
  until = (until,) if isinstance(until, str) else tuple(until)
  max_new = int(settings.get("max_gen_toks") or default_max_tokens)
  sampled = bool(settings.get("do_sample", False))
  temperature = float(settings.get("temperature", 1.0 if sampled else 0.0) or 0.0)
  if not sampled:
    temperature = 0.0
  ids = model.with_bos(model.encode(context))  # A prompt starts as the tokenizer starts text.
  room = model.generator.cache_length - max_new
  if room < 1:
    raise UsageError(f"generate_until: max_gen_toks={max_new} leaves no room for a context in "
                     f"the decode cache of {model.generator.cache_length}; lower it")
  return Request(source=f"lm_eval request {index}", prompt_ids=tuple(ids[-room:]),
                 max_new_tokens=max_new, temperature=temperature,
                 top_p=settings.get("top_p"), top_k=settings.get("top_k"),
                 seed=_seed(settings, sampled, index), stop=tuple(s for s in until if s))


def _seed(settings: Mapping[str, Any], sampled: bool, index: int) -> int | None:
  """The request's seed: its own, else for a sampled request its index in the call (lm_eval
  repeats a request to draw several samples: one seed for all would draw one sample n times)."""
  seed = settings.get("seed")
  if seed is None and sampled:
    return index
  return seed


def generate_until(model: Any, requests: Sequence[tuple[str, Mapping[str, Any]]],
                   default_max_tokens: int = 256) -> list[str]:
  """Each context's continuation up to the first `until` string (cut before it)."""
  decoded = [generation_request(model, index, context, settings, default_max_tokens)
             for index, (context, settings) in enumerate(requests)]
  completions = model.generator.generate(decoded)
  return [c.completion_text or "" for c in completions]
