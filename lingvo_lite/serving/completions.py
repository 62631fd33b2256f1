"""One completions request through the engine: its choices decoded, their log-probabilities
read, the OpenAI-shaped answer built (whole, or as server-sent events).

A request with `n` choices per prompt becomes prompts x n decode requests (choice
`prompt_index * n + i`, seeded `seed + i`: OpenAI's order), queued together or refused together.
`logprobs` and `echo` are read by one scoring pass over prompt + completion after the choice
ends (scoring/scorer.py): the log-probability of each token given those before it, with the
top alternatives of the same pass, so a token's entry and its alternatives always agree (lm_eval
decides `is_greedy` by comparing them).

Streaming sends each choice's new text after every decode round, holding back what could
still become a stop string (the longest stop string less one character) and a trailing
partial character; a choice's last chunk carries its `finish_reason` (and its `logprobs`,
which are read when it ends).

Longer than 300 lines with a reason: the whole answer and the streamed one are the same
choices in the same shapes (text, logprobs, usage); split, the shapes would need the run's
request, choices and scores handed to them piece by piece.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from typing import Any, AsyncIterator, Callable, Sequence

from lingvo_lite.decode.requests import Request
from lingvo_lite.errors import UsageError
from lingvo_lite.serving import openai_api
from lingvo_lite.serving.engine import Engine
from lingvo_lite.serving.openai_api import RequestError

_FIELD_AFTER_SOURCE = re.compile(r"^[^:]*: (\w+)")


class Timeout(RuntimeError):
  """The request ran past the server's --request_timeout_s (the server answers 504)."""


def usage_error(error: UsageError, source: str = "prompt",
                length_field: str = "max_tokens") -> RequestError:
  """A decode request's one-line refusal as a 400 naming the client's field.

  Args:
    error: What resolving the decode request raised; its message starts with `source`.
    source: The client's name for the prompt: `prompt`, `prompt[2]`, `messages` (chat).
    length_field: The client's name for the length (`max_tokens`, `max_completion_tokens`).
  """
  message = str(error)
  named = getattr(error, "field", None)  # A length refusal says which field must shrink.
  if named is None:
    match = _FIELD_AFTER_SOURCE.match(message)
    named = match.group(1) if match else None
  if named == "max_new_tokens":
    field = length_field
  elif named in openai_api.COMPLETION_FIELDS and named != "prompt":
    field = named
  else:
    field = source
  message = message.replace("max_new_tokens", length_field).replace("prompt_ids", "prompt")
  return RequestError(field, message.split(": ", 1)[-1])


@dataclasses.dataclass
class Choice:
  """One choice being made."""

  index: int
  job: Any  # The resolved decode request; None when nothing is generated (echo, 0 tokens).
  prompt_ids: tuple[int, ...]
  completion: Any = None
  error: str | None = None
  scores: Any = None
  sent: str = ""  # Streaming: the completion text sent so far.
  finished: bool = False


class CompletionRun:
  """A checked request's choices, from queueing to the answer (see the module doc)."""

  def __init__(self, engine: Engine, request: openai_api.CompletionRequest, model_name: str,
               timeout_s: float, object_name: str = "text_completion",
               prompt_ids: Sequence[tuple[int, ...]] | None = None,
               prompt_field: str = "prompt", length_field: str = "max_tokens"):
    """
    Args:
      prompt_ids: The prompts as ids where the caller tokenized them (chat); else
        `request.prompts` are given to the decode requests as they are.
      prompt_field: The client's field that gave the prompts (`messages` for chat), as
        refusals name it.
      length_field: The client's field that gave the length (`max_tokens`,
        `max_completion_tokens`), as refusals name it.
    """
    self.prompt_field = prompt_field
    self.length_field = length_field
    self.engine = engine
    self.model = engine.model
    self.request = request
    self.model_name = model_name
    self.deadline = time.monotonic() + timeout_s
    self.object_name = object_name
    self.id = openai_api.new_id("cmpl" if object_name == "text_completion" else "chatcmpl")
    self.created = openai_api.now()
    self._loop = asyncio.get_running_loop()
    self._events: asyncio.Queue = asyncio.Queue()
    self._tickets: list[Any] = []
    self.choices = self._resolve(prompt_ids)

  # ------------------------------------------------------------------------ queueing

  def _resolve(self, given_ids: Sequence[tuple[int, ...]] | None) -> list[Choice]:
    request, sampling = self.request, self.request.sampling
    prompts = list(given_ids) if given_ids is not None else list(request.prompts)
    if len(prompts) * sampling.n > self.engine.max_outstanding:
      # Refused before any prompt is tokenized: a flood in one body costs nothing. A 429 (the
      # limit is the server's), naming what to lower.
      raise RequestError(
          self.prompt_field if len(prompts) > 1 else "n",
          f"{len(prompts)} prompts x n={sampling.n} choices are more than the server holds "
          f"at once (--max_outstanding={self.engine.max_outstanding})", status=429)
    default_seed = self.model.setup.decode.seed
    choices = []
    for prompt_index, prompt in enumerate(prompts):
      source = (self.prompt_field if len(prompts) == 1
                else f"{self.prompt_field}[{prompt_index}]")
      for i in range(sampling.n):
        seed = (sampling.seed if sampling.seed is not None else default_seed) + i
        try:
          decode_request = Request(
              source=source, prompt=prompt if isinstance(prompt, str) else None,
              prompt_ids=None if isinstance(prompt, str) else tuple(prompt),
              max_new_tokens=max(sampling.max_tokens, 1), temperature=sampling.temperature,
              top_k=sampling.top_k, top_p=sampling.top_p, seed=seed % 2**63,
              stop=sampling.stop)
          job = self.engine.resolve(decode_request)
        except UsageError as e:
          raise usage_error(e, source, self.length_field) from None
        generated = sampling.max_tokens > 0
        choices.append(Choice(index=len(choices), job=job if generated else None,
                              prompt_ids=job.prompt_ids))
    return choices

  def submit(self) -> None:
    """Queues the choices that generate.

    Raises:
      QueueFull: the engine holds too many requests already.
    """
    generating = [c for c in self.choices if c.job is not None]
    callbacks = [self._callbacks(c) for c in generating]
    self._tickets = self.engine.submit([c.job for c in generating], callbacks)
    for choice in self.choices:
      if choice.job is None:
        choice.finished = True

  def _callbacks(self, choice: Choice) -> tuple[Callable, Callable, Callable | None]:
    put = lambda *event: self._loop.call_soon_threadsafe(self._events.put_nowait, event)
    tokens = (lambda ids: put("tokens", choice, ids)) if self.request.stream else None
    return (lambda completion: put("done", choice, completion),
            lambda message: put("error", choice, message), tokens)

  def cancel(self) -> None:
    """Frees the engine of every choice still running (a client gone, a timeout)."""
    for ticket in self._tickets:
      self.engine.cancel(ticket)

  async def _next_event(self, disconnected: Callable[[], Any]) -> tuple:
    """The engine's next report; Timeout past the deadline; None when the client left."""
    while True:
      left = self.deadline - time.monotonic()
      if left <= 0:
        raise Timeout()
      try:
        return await asyncio.wait_for(self._events.get(), timeout=min(left, 0.5))
      except asyncio.TimeoutError:
        if await disconnected():
          return ("gone",)

  # ------------------------------------------------------------------------ answering

  async def _score(self, choices: Sequence[Choice]) -> None:
    """Fills `scores` of `choices` (prompt + completion ids) in one engine call."""
    sequences = [list(c.prompt_ids) + list(self._completion_ids(c)) for c in choices]
    future = self._loop.create_future()
    settle = lambda method, value: self._loop.call_soon_threadsafe(
        lambda: future.done() or getattr(future, method)(value))
    self.engine.score(sequences, lambda scores: settle("set_result", scores),
                      lambda message: settle("set_exception", RuntimeError(message)))
    left = max(self.deadline - time.monotonic(), 0.001)
    try:
      scores = await asyncio.wait_for(future, timeout=left)
    except asyncio.TimeoutError:
      raise Timeout() from None
    for choice, score in zip(choices, scores):
      choice.scores = score

  def _completion_ids(self, choice: Choice) -> tuple[int, ...]:
    return choice.completion.completion_ids if choice.completion is not None else ()

  def _wants_scores(self) -> bool:
    return self.request.logprobs is not None or self.request.echo

  async def whole(self, disconnected: Callable[[], Any]) -> dict[str, Any] | None:
    """The answer once every choice has ended (None when the client left)."""
    try:
      while not all(c.finished for c in self.choices):
        event = await self._next_event(disconnected)
        if event[0] == "gone":
          self.cancel()
          return None
        self._take(event)
    except BaseException:
      self.cancel()
      raise
    failed = [c for c in self.choices if c.error]
    if failed:
      raise RuntimeError(failed[0].error)
    if self._wants_scores():
      await self._score(self.choices)
    return self._body([self._choice_body(c) for c in self.choices], usage=True)

  def _take(self, event: tuple) -> None:
    kind, choice, value = event
    if kind == "done":
      choice.completion, choice.finished = value, True
    elif kind == "error":
      choice.error, choice.finished = value, True

  async def events(self, disconnected: Callable[[], Any]) -> AsyncIterator[str]:
    """The answer as server-sent events, `data: [DONE]` last."""
    try:
      if self.request.echo:
        for choice in self.choices:
          yield self._chunk(choice, self._prompt_text(choice))
      pending = [c for c in self.choices if c.finished]  # Nothing generated: echo only.
      while True:
        for choice in pending:
          yield await self._final_chunk(choice)
        if all(c.finished for c in self.choices):
          break
        event = await self._next_event(disconnected)
        if event[0] == "gone":
          self.cancel()
          return
        kind, choice, value = event
        pending = []
        if kind == "tokens":
          delta = self._stream_delta(choice, value)
          if delta:
            yield self._chunk(choice, delta)
        else:
          self._take(event)
          pending = [choice]
      if self.request.include_usage:
        yield _sse(self._body([], usage=True))
      yield "data: [DONE]\n\n"
    except Timeout:
      self.cancel()
      yield _sse(openai_api.error_body("the request ran past the server's "
                                       "--request_timeout_s", None, "timeout"))
      yield "data: [DONE]\n\n"
    except BaseException:
      self.cancel()
      raise

  def _stream_delta(self, choice: Choice, ids: list[int]) -> str:
    text = self.model.generator.resolver.completion_text(choice.prompt_ids, ids) or ""
    hold = max((len(s) for s in choice.job.stop), default=1) - 1
    safe = text[:len(text) - hold] if hold else text
    while safe.endswith("\ufffd"):  # A character whose bytes are not all generated yet.
      safe = safe[:-1]
    if not safe.startswith(choice.sent) or len(safe) <= len(choice.sent):
      return ""
    delta, choice.sent = safe[len(choice.sent):], safe
    return delta

  async def _final_chunk(self, choice: Choice) -> str:
    if choice.error:
      return _sse(openai_api.error_body(choice.error, None, "server_error"))
    if self._wants_scores():
      await self._score([choice])
    body = self._choice_body(choice)
    text = body["text"] if self.object_name == "text_completion" else body["message"]["content"]
    if self.request.echo and self.object_name == "text_completion":
      text = text[len(self._prompt_text(choice)):]
    rest = text[len(choice.sent):] if text.startswith(choice.sent) else ""
    return self._chunk(choice, rest, finish_reason=body["finish_reason"],
                       logprobs=body.get("logprobs"))

  # ------------------------------------------------------------------------ shapes

  def _prompt_text(self, choice: Choice) -> str:
    return self.model.decode(choice.prompt_ids)

  def _finish_reason(self, choice: Choice) -> str | None:
    if choice.completion is None:
      return "length"  # Echo with max_tokens 0: the length allowed was reached.
    return "length" if choice.completion.stop_reason == "max_new_tokens" else "stop"

  def _choice_body(self, choice: Choice) -> dict[str, Any]:
    completion_text = choice.completion.completion_text or "" if choice.completion else ""
    reason = self._finish_reason(choice)
    if self.object_name != "text_completion":
      body = {"index": choice.index, "finish_reason": reason,
              "message": {"role": "assistant", "content": completion_text}}
      if self.request.logprobs is not None:
        body["logprobs"] = {"content": self._chat_logprobs(choice)}
      return body
    text = (self._prompt_text(choice) if self.request.echo else "") + completion_text
    return {"index": choice.index, "text": text, "finish_reason": reason,
            "logprobs": self._logprobs(choice) if self.request.logprobs is not None else None}

  def _entries(self, choice: Choice) -> list[tuple[int, float | None, dict[str, float] | None]]:
    """(token, its log-probability, its top alternatives) for the tokens answered: the
    prompt's with `echo` (the first has none: nothing precedes it), then the completion's."""
    scores = choice.scores
    ids = list(choice.prompt_ids) + list(self._completion_ids(choice))
    top = self.request.logprobs or 0
    first = 0 if self.request.echo else len(choice.prompt_ids)
    entries = []
    for position in range(first, len(ids)):
      if position == 0:
        entries.append((ids[0], None, None))
        continue
      j = position - 1  # Score j is for token j + 1.
      alternatives = {}
      for token, value in zip(scores.top_ids[j][:top], scores.top_logprobs[j][:top]):
        alternatives.setdefault(self.model.token_text(int(token)), float(value))
      entries.append((ids[position], float(scores.logprobs[j]), alternatives))
    return entries

  def _logprobs(self, choice: Choice) -> dict[str, Any]:
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    offset = 0
    for token, value, alternatives in self._entries(choice):
      text = self.model.token_text(token)
      tokens.append(text)
      token_logprobs.append(value)
      top_logprobs.append(alternatives)
      offsets.append(offset)
      offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": offsets}

  def _chat_logprobs(self, choice: Choice) -> list[dict[str, Any]]:
    return [{"token": self.model.token_text(token), "logprob": value,
             "top_logprobs": [{"token": t, "logprob": v} for t, v in (alt or {}).items()]}
            for token, value, alt in self._entries(choice)]

  def _usage(self) -> dict[str, int]:
    prompt = sum(len(ids) for ids in {c.index // self.request.sampling.n: c.prompt_ids
                                      for c in self.choices}.values())
    completion = sum(len(self._completion_ids(c)) for c in self.choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}

  def _body(self, choices: list[dict[str, Any]], usage: bool,
            chunk: bool = False) -> dict[str, Any]:
    name = self.object_name + (".chunk" if chunk and self.object_name != "text_completion"
                               else "")
    body = {"id": self.id, "object": name, "created": self.created, "model": self.model_name,
            "choices": choices}
    if usage:
      body["usage"] = self._usage()
    return body

  def _chunk(self, choice: Choice, text: str, finish_reason: str | None = None,
             logprobs: Any = None) -> str:
    if self.object_name == "text_completion":
      entry = {"index": choice.index, "text": text, "logprobs": logprobs,
               "finish_reason": finish_reason}
    else:
      entry = {"index": choice.index, "delta": {"role": "assistant", "content": text},
               "logprobs": logprobs, "finish_reason": finish_reason}
    return _sse(self._body([entry], usage=False, chunk=True))


def _sse(body: dict[str, Any]) -> str:
  return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

