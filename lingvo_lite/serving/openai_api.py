"""The OpenAI-style request bodies the server accepts, checked field by field, and the response
shapes it answers with. No HTTP here and no device: the app (serving/app.py) turns a
`RequestError` into a 400 whose JSON names the field and the fix.

/v1/completions fields: `prompt` (a string, a list of strings, a list of token ids, or a list
of such lists), `model`, `max_tokens` (default 16, as OpenAI's; 0 with `echo` scores the
prompt only), `temperature`, `top_p`, `top_k` (an extension, as vLLM has it; 0 or -1 is off),
`stop` (a string or a list of them), `seed`, `n`, `logprobs` (0 to 5 alternatives per token),
`echo`, `stream`, `user` (ignored). /v1/chat/completions takes `messages` instead of `prompt`
(each message `role`, `content` and an optional `name`, all strings), `logprobs` as a bool with
`top_logprobs`, and `max_completion_tokens` as another name of `max_tokens`. /tokenize reads
`prompt`, `add_special_tokens`, `model`; /detokenize `tokens`, `model`. Fields OpenAI has and
this server does not implement (`suffix`, `logit_bias`, penalties other than 0, `best_of` other
than n) are refused by name, never ignored, as is any field no route reads.

The bodies arrive here already decoded and checked as JSON (serving/request_body.py: UTF-8,
nesting, text that is Unicode); values echoed in a refusal are `errors.shown`'s, never long.

Longer than 300 lines with a reason: the four routes' bodies share one set of field checks (an
integer's bounds, a number's, stop strings, unknown and unimplemented fields) and their wording;
split by route, each module would reach into the others' checks.
"""

from __future__ import annotations

import dataclasses
import numbers
import time
import uuid
from typing import Any, Sequence

from lingvo_lite.errors import shown

MAX_LOGPROBS = 5  # OpenAI's cap on alternatives per token.
MAX_N = 16
MAX_STOP = 16  # Stop strings a request may give (OpenAI allows 4); each is searched per round.
DEFAULT_MAX_TOKENS = 16

_COMMON = ("model", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "n",
           "stream", "user", "presence_penalty", "frequency_penalty", "stream_options")
COMPLETION_FIELDS = ("prompt", "logprobs", "echo", "best_of", "suffix", "logit_bias") + _COMMON
CHAT_FIELDS = ("messages", "logprobs", "top_logprobs", "max_completion_tokens",
               "logit_bias") + _COMMON
MESSAGE_FIELDS = ("role", "content", "name")
# vLLM's /tokenize and /detokenize, as lm_eval's remote tokenizer calls them.
TOKENIZE_FIELDS = ("model", "prompt", "add_special_tokens")
DETOKENIZE_FIELDS = ("model", "tokens")


class RequestError(ValueError):
  """A request the server refuses: `field` names what is wrong; the message says the fix."""

  def __init__(self, field: str, message: str, status: int = 400):
    super().__init__(f"{field}: {message}")
    self.field = field
    self.status = status


@dataclasses.dataclass(frozen=True)
class Sampling:
  """A request's generation settings, already checked (None: the config's `decode.*`)."""

  max_tokens: int
  temperature: float | None
  top_p: float | None
  top_k: int | None
  stop: tuple[str, ...] | None
  seed: int | None
  n: int


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
  """A checked /v1/completions (or chat) request.

  Attributes:
    prompts: Each prompt as text (str) or token ids (tuple of ints).
    sampling: The generation settings.
    logprobs: Alternatives per token to return (0 to 5), or None for no log-probabilities.
    echo: The prompt is returned before the completion (with its log-probabilities).
    stream: Answer as server-sent events.
    include_usage: With `stream`, a last chunk carries `usage` (stream_options).
  """

  prompts: tuple[str | tuple[int, ...], ...]
  sampling: Sampling
  logprobs: int | None
  echo: bool
  stream: bool
  include_usage: bool = False


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _int(body: dict, name: str, default: Any, low: int, high: int | None = None) -> Any:
  value = body.get(name)
  if value is None:
    return default
  if not _is_int(value) or value < low or (high is not None and value > high):
    bound = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"
    raise RequestError(name, f"{shown(value)} is not {bound}")
  return int(value)


def _float(body: dict, name: str, low: float, high: float, low_open: bool = False
           ) -> float | None:
  value = body.get(name)
  if value is None:
    return None
  if (not _is_number(value) or value != value or value > high
      or (value <= low if low_open else value < low)):
    bracket = "(" if low_open else "["
    raise RequestError(name, f"{shown(value)} is not a number in {bracket}{low}, {high}]")
  return float(value)


def _bool(body: dict, name: str) -> bool:
  value = body.get(name)
  if value is None:
    return False
  if not isinstance(value, bool):
    raise RequestError(name, f"{shown(value)} is not true or false")
  return value


def _stop(body: dict) -> tuple[str, ...] | None:
  value = body.get("stop")
  if value is None:
    return None
  values = [value] if isinstance(value, str) else value
  if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
    raise RequestError("stop", f"{shown(value)} is not a non-empty string or a list of them")
  if len(values) > MAX_STOP:
    raise RequestError("stop", f"{len(values)} stop strings; give at most {MAX_STOP}")
  return tuple(values)


def _check_object(body: Any, known: Sequence[str]) -> None:
  """Refuses a body that is not a JSON object, a field outside `known` (the route's fields),
  and the settings OpenAI has that this server does not implement."""
  if not isinstance(body, dict):
    raise RequestError("body", "not a JSON object")
  unknown = sorted(set(body) - set(known))
  if unknown:
    # An empty name cannot name itself: the body is named.
    field, what = (unknown[0], "not") if unknown[0] else ("body", "'' is not")
    raise RequestError(field, f"{what} a field this server reads; the fields are "
                       f"{', '.join(sorted(known))}")
  for name in ("presence_penalty", "frequency_penalty"):
    if body.get(name) not in (None, 0, 0.0):
      raise RequestError(name, f"{shown(body[name])}: penalties are not implemented; leave it "
                         "out or 0")
  if body.get("logit_bias"):
    raise RequestError("logit_bias", "not implemented; leave it out")


def _sampling(body: dict, max_tokens_field: str = "max_tokens") -> Sampling:
  top_k = _int(body, "top_k", None, -1)
  return Sampling(
      max_tokens=_int(body, max_tokens_field, DEFAULT_MAX_TOKENS, 0),
      temperature=_float(body, "temperature", 0.0, 100.0),
      top_p=_float(body, "top_p", 0.0, 1.0, low_open=True),
      top_k=None if top_k is None else max(top_k, 0),
      stop=_stop(body), seed=_int(body, "seed", None, 0, 2**63 - 1),
      n=_int(body, "n", 1, 1, MAX_N))


def _stream(body: dict) -> tuple[bool, bool]:
  stream = _bool(body, "stream")
  options = body.get("stream_options")
  if options is None:
    return stream, False
  if not isinstance(options, dict) or set(options) - {"include_usage"}:
    raise RequestError("stream_options", f"{shown(options)} is not an object with "
                       "include_usage")
  if not stream:
    raise RequestError("stream_options", "only with stream: true")
  return stream, bool(options.get("include_usage", False))


def _prompts(value: Any, vocab_size: int) -> tuple[str | tuple[int, ...], ...]:
  """The prompt field as a tuple of prompts (text, or token ids)."""
  def ids(items: list, where: str) -> tuple[int, ...]:
    if not items:
      raise RequestError(where, "an empty list of token ids; give at least one")
    for item in items:
      if not _is_int(item) or not 0 <= item < vocab_size:
        raise RequestError(where, f"token id {shown(item)} is not an integer in "
                           f"[0, {vocab_size})")
    return tuple(int(i) for i in items)

  if isinstance(value, str):
    return (value,)
  if isinstance(value, list) and value:
    if all(isinstance(v, str) for v in value):
      return tuple(value)
    if all(_is_int(v) for v in value):
      return (ids(value, "prompt"),)
    if all(isinstance(v, list) for v in value):
      return tuple(ids(v, f"prompt[{i}]") for i, v in enumerate(value))
  raise RequestError("prompt", "give a string, a list of strings, a list of token ids or a "
                     "list of token-id lists (not empty)")


def completion_request(body: Any, vocab_size: int) -> CompletionRequest:
  """A /v1/completions body, checked.

  Raises:
    RequestError: naming the first bad field.
  """
  _check_object(body, COMPLETION_FIELDS)
  if "prompt" not in body:
    raise RequestError("prompt", "missing; give the text (or token ids) to continue")
  if body.get("suffix") is not None:
    raise RequestError("suffix", "insertion is not implemented; leave it out")
  sampling = _sampling(body)
  if body.get("best_of") not in (None, sampling.n):
    raise RequestError("best_of", f"{shown(body['best_of'])}: only best_of equal to n is "
                       "implemented; leave it out")
  logprobs = _int(body, "logprobs", None, 0, MAX_LOGPROBS)
  echo = _bool(body, "echo")
  if sampling.max_tokens == 0 and not echo:
    raise RequestError("max_tokens", "0 generates nothing; it is allowed only with echo: true "
                       "(to score the prompt)")
  stream, usage = _stream(body)
  return CompletionRequest(prompts=_prompts(body["prompt"], vocab_size), sampling=sampling,
                           logprobs=logprobs, echo=echo, stream=stream, include_usage=usage)


def _check_message(message: Any, where: str) -> None:
  """One chat message: string `role` and `content`, and an optional string `name`; other
  fields would reach the model's chat template, which expects none of them."""
  if not isinstance(message, dict):
    raise RequestError(where, f"{shown(message)} is not an object with a string role and a "
                       "string content")
  unknown = sorted(set(message) - set(MESSAGE_FIELDS))
  if unknown:
    raise RequestError(f"{where}.{unknown[0]}", "not a message field this server reads; the "
                       f"fields are {', '.join(MESSAGE_FIELDS)}")
  for name in MESSAGE_FIELDS:
    value = message.get(name)
    if (name != "name" or value is not None) and not isinstance(value, str):
      raise RequestError(f"{where}.{name}", f"{shown(value)} is not a string")


def chat_length_field(body: dict) -> str:
  """The field a chat request's length is given by: `max_tokens`, or `max_completion_tokens`
  (OpenAI's name now); not both."""
  if "max_completion_tokens" not in body:
    return "max_tokens"
  if "max_tokens" in body:
    raise RequestError("max_completion_tokens", "given with max_tokens; give one of them")
  return "max_completion_tokens"


def chat_request(body: Any) -> tuple[list[dict[str, str]], CompletionRequest]:
  """A /v1/chat/completions body, checked: (its messages, the request without a prompt).

  Raises:
    RequestError: naming the first bad field.
  """
  _check_object(body, CHAT_FIELDS)
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages:
    raise RequestError("messages", "give a non-empty list of {role, content} objects")
  for index, message in enumerate(messages):
    _check_message(message, f"messages[{index}]")
  length_field = chat_length_field(body)
  sampling = _sampling(body, length_field)
  if sampling.max_tokens == 0:
    raise RequestError(length_field, "0 generates nothing; give at least 1")
  top = _int(body, "top_logprobs", None, 0, MAX_LOGPROBS)
  logprobs = (top or 0) if _bool(body, "logprobs") else None
  if top is not None and logprobs is None:
    raise RequestError("top_logprobs", "only with logprobs: true")
  stream, usage = _stream(body)
  return [dict(m) for m in messages], CompletionRequest(
      prompts=(), sampling=sampling, logprobs=logprobs, echo=False, stream=stream,
      include_usage=usage)


def tokenize_request(body: Any) -> tuple[str, bool]:
  """A /tokenize body, checked: (its text, whether BOS is added where the tokenizer adds it).

  Raises:
    RequestError: naming the first bad field.
  """
  _check_object(body, TOKENIZE_FIELDS)
  if not isinstance(body.get("prompt"), str):
    raise RequestError("prompt", f"{shown(body.get('prompt'))}: give the text to tokenize as a "
                       "string")
  return body["prompt"], _bool(body, "add_special_tokens")


def detokenize_request(body: Any, vocab_size: int) -> list[int]:
  """A /detokenize body's token ids, checked.

  Raises:
    RequestError: naming the first bad field.
  """
  _check_object(body, DETOKENIZE_FIELDS)
  tokens = body.get("tokens")
  if not isinstance(tokens, list) or not all(_is_int(t) and 0 <= t < vocab_size
                                             for t in tokens):
    raise RequestError("tokens", f"{shown(tokens)}: give a list of token ids in "
                       f"[0, {vocab_size})")
  return [int(t) for t in tokens]


def new_id(prefix: str) -> str:
  return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
  return int(time.time())


def error_body(message: str, field: str | None, kind: str = "invalid_request_error"
               ) -> dict[str, Any]:
  """OpenAI's error object."""
  return {"error": {"message": message, "type": kind, "param": field, "code": None}}
