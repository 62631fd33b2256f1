"""Decode requests (what `--mode=decode` is asked to generate) and the records of its answers.

Requests come from the command line, in this order, and both sources may be given at once:

  --prompt="TEXT"            repeatable; each one request with the config's settings
  --prompts_file=FILE.jsonl  one JSON object per line, e.g.
                             {"prompt": "Once upon a time", "max_new_tokens": 32, "stop": "\\n"}

A line's fields (`REQUEST_FIELDS`): exactly one of `prompt` (text; needs a text vocabulary)
or `prompt_ids` (a non-empty list of token ids, for experiments without one), and any of the
sampling settings, each overriding the config's `decode.*` default for that request:
`max_new_tokens` (int >= 1), `temperature` (number >= 0; 0 decodes greedily), `top_k`
(int >= 0; 0 keeps every token), `top_p` (number in (0, 1]), `seed` (int in [0, 2**63)) and
`stop` (a string or a list of non-empty strings; `[]` turns the config's stop strings off).
Ints must be written as ints (`3`, not `3.0` or `true`); `null` is the same as leaving the
field out. Blank lines are skipped, but messages give the file's own line numbers. Token ids
are checked against the vocabulary size, and prompt lengths against the model's sequence
length, by the program, which knows them.

Each answer is one JSON line (strict JSON: no NaN or Infinity), `record()`'s schema 1:

  schema_version   1; a reader refuses versions it does not know.
  index            int: the request's position among all requests (--prompt ones first), from 0.
  source           str: where the request came from: "--prompt #1" or "p.jsonl:3" (file:line).
  prompt           str or null: the prompt as text (null without a text vocabulary).
  prompt_ids       [int]: the token ids the model was given as the prompt.
  completion       str or null: the generated text, cut just before the stop string that
                   ended it (null without a text vocabulary).
  completion_ids   [int]: every generated token, up to and including the EOS token or the
                   token that completed a stop string.
  logprobs         [float or null]: one per completion_ids entry: the model's own
                   log-probability of that token (log-softmax of the logits before
                   temperature, top-k and top-p); null where it is not finite.
  stop_reason      "eos" | "stop" (a stop string) | "max_new_tokens".
  stop_string      str or null: the stop string that matched, for "stop".
  settings         {max_new_tokens, temperature, top_k, top_p, seed, stop}: the values used,
                   after the config's defaults were applied.
  checkpoint_step  int: the step of the checkpoint whose parameters decoded it.
  timing           {prefill_seconds: from the start of its prefill call to its first token,
                    decode_seconds: from its first token to its last,
                    tokens_per_second: (len(completion_ids) - 1) / decode_seconds, the decode
                    rate after the first token; null where decode_seconds is 0}.

`CompletionWriter` writes them to a file (by default JOB/decode/<UTC time>.jsonl) or to stdout.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import numbers
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence

from etils import epath

from lingvo_lite import paths
from lingvo_lite.errors import UsageError, config_error, shown

REQUEST_FIELDS = ("prompt", "prompt_ids", "max_new_tokens", "temperature", "top_k", "top_p",
                  "seed", "stop")
SCHEMA_VERSION = 1
STOP_REASONS = ("eos", "stop", "max_new_tokens")

_INT64_LIMIT = 2**63  # Token ids: JAX computes with at most int64.
_INT32_LIMIT = 2**31  # max_new_tokens and top_k become int32 arrays in the decode loop.
# As decode.seed's Range: decoding.key_data makes a key of both 32-bit halves on the host
# (jax.random.key(seed) itself would keep only the low 32 bits without jax_enable_x64).
_SEED_LIMIT = 2**63
# Temperature and top_p become float32: a larger temperature would be inf there, a smaller
# top_p 0 (or a subnormal), which the sampler refuses or divides by.
_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_TINY = 2.0**-126
_EXAMPLE = '{"prompt": "Once upon a time"}'


@dataclasses.dataclass(frozen=True)
class Request:
  """One prompt to continue, and the settings that override the config's for it.

  A request is valid once constructed (the same checks as a prompts file's line). A setting
  left None takes the config's `decode.*` value.

  Attributes:
    source: Where it came from, for messages and the output: "--prompt #1" or "p.jsonl:3".
    prompt: The text to continue; needs a text vocabulary.
    prompt_ids: Token ids to continue, for experiments without a text vocabulary.
    max_new_tokens: Most tokens to generate, >= 1.
    temperature: >= 0 and finite; 0 decodes greedily.
    top_k: >= 0; 0 keeps every token.
    top_p: In (0, 1].
    seed: In [0, 2**63).
    stop: Stop strings, each non-empty; () turns the config's off.
  """

  source: str
  prompt: str | None = None
  prompt_ids: tuple[int, ...] | None = None
  max_new_tokens: int | None = None
  temperature: float | None = None
  top_k: int | None = None
  top_p: float | None = None
  seed: int | None = None
  stop: tuple[str, ...] | None = None

  def __post_init__(self):
    _checked_fields(f"{self.source}: ", {
        name: getattr(self, name) for name in REQUEST_FIELDS if getattr(self, name) is not None})

  def overrides(self) -> dict[str, Any]:
    """The settings this request gives ({name: value}), the config's to be used for the rest."""
    return {name: getattr(self, name) for name in REQUEST_FIELDS[2:]
            if getattr(self, name) is not None}


# ----------------------------------------------------------------------------- value checks


def check_sampling(where: str, temperature=None, top_k=None, top_p=None, max_new_tokens=None,
                   seed=None, stop=None) -> None:
  """Refuses a sampling setting no decode can use; None means "not given" and passes.

  The same checks serve a prompts file's line and the config's `decode.*` part, so `where` is
  the prefix the setting's name follows: "--prompts_file=p.jsonl line 3: " or "decode.".

  Bounds: max_new_tokens >= 1 and top_k >= 0, both below 2**31; temperature in
  [0, float32's max]; top_p in (0, 1], at least 2**-126; seed in [0, 2**63); stop a list or
  tuple of non-empty strings (a plain string is refused here: it would be read as its
  characters; a prompts file's single string is made a list before this check).

  Raises:
    UsageError: `{where}{name}={value}: {problem}; {fix}`, e.g.
      `decode.top_p=1.5: must be in (0, 1]; give ...`. Bools are not ints or numbers; NaN and
      infinities are refused.
  """
  if max_new_tokens is not None:
    _check_int(where, "max_new_tokens", max_new_tokens, 1, _INT32_LIMIT,
               "give the most tokens to generate, e.g. 64")
  if temperature is not None:
    _check_number(where, "temperature", temperature,
                  "give 0 to decode greedily or a positive temperature, e.g. 0.8")
    if not 0 <= temperature <= _FLOAT32_MAX:
      problem = "must be >= 0" if temperature < 0 else "is too large for float32"
      raise config_error(f"{where}temperature", temperature, problem,
                         "give 0 to decode greedily or a positive temperature, e.g. 0.8")
  if top_k is not None:
    _check_int(where, "top_k", top_k, 0, _INT32_LIMIT,
               "give 0 to keep every token, or how many of the likeliest to sample from")
  if top_p is not None:
    fix = "give 1 to keep every token, or the probability mass to sample from, e.g. 0.9"
    _check_number(where, "top_p", top_p, fix)
    if not 0 < top_p <= 1:
      raise config_error(f"{where}top_p", top_p, "must be in (0, 1]", fix)
    if top_p < _FLOAT32_TINY:
      raise config_error(f"{where}top_p", top_p, "is too small for float32 (below 2**-126)",
                         fix)
  if seed is not None:
    _check_int(where, "seed", seed, 0, _SEED_LIMIT, "give an int in [0, 2**63), e.g. 0")
  if stop is not None:
    _check_stop(where, stop)


def _check_int(where: str, name: str, value: object, low: int, limit: int, fix: str) -> None:
  path = f"{where}{name}"
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
      fix = f"write {int(value)}"  # JSON's 3.0 or 1e3: a float where the count must be exact.
    raise config_error(path, value, f"must be an int, not {_kind(value)}", fix)
  if not low <= value < limit:
    bound = f">= {low}" if value < low else f"below 2**{limit.bit_length() - 1}"
    raise config_error(path, value, f"must be {bound}", fix)


def _check_number(where: str, name: str, value: object, fix: str) -> None:
  path = f"{where}{name}"
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise config_error(path, value, f"must be a number, not {_kind(value)}", fix)
  try:
    finite = math.isfinite(value)
  except OverflowError:  # An int too large for a float (JSON's 1000...0).
    finite = False
  if not finite:
    raise config_error(path, value, "must be finite", fix)


def _check_stop(where: str, stop: object) -> None:
  path = f"{where}stop"
  fix = 'give a string or a list of strings, e.g. ["\\n\\n"]'
  if not isinstance(stop, (list, tuple)):
    raise config_error(path, stop, f"must be a list of strings, not {_kind(stop)}", fix)
  for i, text in enumerate(stop):
    if not isinstance(text, str):
      raise config_error(path, stop, f"entry {i} is {shown(text)}, not a string", fix)
    if not text:
      raise config_error(path, stop, f"entry {i} is '', which would stop before any token",
                         "drop it")
    _check_unicode(path, stop, text, f"entry {i} ")


def _check_unicode(path: str, value: object, text: str, which: str = "") -> None:
  """Refuses lone surrogates (JSON's "\\ud800"; argv bytes that are not UTF-8): no tokenizer
  encodes them, and no UTF-8 output can hold them."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    bad = text[e.start]
    raise config_error(path, value, f"{which}holds {bad!r} at character {e.start}, which is not "
                       "text (a lone surrogate, or bytes that are not UTF-8)",
                       "give valid UTF-8 text") from None


def _kind(value: object) -> str:
  name = type(value).__name__
  return {"NoneType": "null", "dict": "an object", "list": "a list", "str": "a string",
          "bool": "a bool", "float": "a float", "int": "an int"}.get(name, f"a {name}")


def _checked_fields(where: str, fields: Mapping[str, Any]) -> dict[str, Any]:
  """`fields` (a prompts file's object, or a Request's) checked and in Request's types."""
  unknown = [name for name in fields if name not in REQUEST_FIELDS]
  if unknown:
    close = difflib.get_close_matches(str(unknown[0]), REQUEST_FIELDS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UsageError(f"{where}unknown field {shown(unknown[0])}; {hint}valid fields: "
                     f"{', '.join(REQUEST_FIELDS)}")
  prompt, ids = fields.get("prompt"), fields.get("prompt_ids")
  if prompt is not None and ids is not None:
    raise UsageError(f"{where}gives both prompt and prompt_ids; give one of them (text, or "
                     "token ids)")
  if prompt is None and ids is None:
    raise UsageError(f'{where}gives neither prompt nor prompt_ids; add "prompt": "TEXT", or '
                     '"prompt_ids": [ID, ...] for a model without a text vocabulary')
  result = dict(fields)
  if prompt is not None:
    if not isinstance(prompt, str):
      raise config_error(f"{where}prompt", prompt, f"must be a string, not {_kind(prompt)}",
                         'give the text to continue, or "prompt_ids" for token ids')
    if not prompt:
      raise config_error(f"{where}prompt", prompt, "is empty", "give the text to continue")
    _check_unicode(f"{where}prompt", prompt, prompt)
  if ids is not None:
    fix = "give a non-empty list of token ids (ints >= 0), e.g. [1, 42]"
    if not isinstance(ids, (list, tuple)) or not ids:
      problem = ("is empty" if isinstance(ids, (list, tuple))
                 else f"must be a list, not {_kind(ids)}")
      raise config_error(f"{where}prompt_ids", ids, problem, fix)
    for i, token in enumerate(ids):
      if (isinstance(token, bool) or not isinstance(token, numbers.Integral)
          or not 0 <= token < _INT64_LIMIT):
        raise config_error(f"{where}prompt_ids", ids, f"entry {i} is {shown(token)}, not a "
                           "token id", fix)
    result["prompt_ids"] = tuple(int(token) for token in ids)
  stop = fields.get("stop")
  if isinstance(stop, str):  # One stop string, as JSON most often gives it.
    if not stop:
      raise config_error(f"{where}stop", stop, "is empty, which would stop before any token",
                         "give the text to stop at, or drop the field")
    stop = (stop,)
  check_sampling(where, temperature=fields.get("temperature"), top_k=fields.get("top_k"),
                 top_p=fields.get("top_p"), max_new_tokens=fields.get("max_new_tokens"),
                 seed=fields.get("seed"), stop=stop)
  if stop is not None:
    result["stop"] = tuple(stop)
  for name in ("temperature", "top_p"):
    if fields.get(name) is not None:
      result[name] = float(fields[name])
  for name in ("max_new_tokens", "top_k", "seed"):
    if fields.get(name) is not None:
      result[name] = int(fields[name])
  return result


# ----------------------------------------------------------------------------- reading requests


def from_flags(prompts: Sequence[str] | None, prompts_file: str | None,
               shown_file: str | None = None) -> list[Request]:
  """The requests of `--prompt` (first, in order) and of `--prompts_file` (then, in order).

  Args:
    prompts: The `--prompt` values; each one non-empty text (whitespace is text).
    prompts_file: The `--prompts_file` path as given (relative to the working directory).
    shown_file: How messages and `Request.source` name the file; the path as given if None.

  Raises:
    UsageError: neither flag given, an empty --prompt, or a file that cannot be read or
      holds a line that is not a valid request: one line naming the flag, the line number
      (the file's own, counting blank lines) and the field.
  """
  requests = []
  for number, prompt in enumerate(prompts or (), 1):
    where = f"--prompt #{number}"
    if not isinstance(prompt, str) or not prompt:
      raise config_error(where, prompt, "an empty prompt",
                         "give the text to continue, or drop this --prompt")
    _check_unicode(where, prompt, prompt)
    requests.append(Request(source=where, prompt=prompt))
  if prompts_file:
    requests.extend(_read_file(prompts_file, shown_file or prompts_file))
  if not requests:
    raise UsageError("no prompts to decode: pass --prompt=TEXT (repeatable) or "
                     f"--prompts_file=FILE.jsonl (one JSON object per line, e.g. {_EXAMPLE})")
  return requests


def _read_file(text: str, name: str) -> list[Request]:
  name = _one_line(name)
  flag = f"--prompts_file={name}"
  path = paths.resolve(text, "--prompts_file")
  fix = f"give a JSON-lines file of requests, one object per line, e.g. {_EXAMPLE}"
  try:
    if not path.exists():
      raise UsageError(f"{flag}: no such file; {fix}")
    if path.is_dir():
      raise UsageError(f"{flag}: is a directory; {fix}")
    data = path.read_bytes()
  except OSError as e:
    raise UsageError(f"{flag}: cannot be read ({e.strerror or type(e).__name__}); make it "
                     "readable, or give another file") from None
  requests = []
  # Lines split on "\n" only: str.splitlines() would also split inside JSON strings at
  # characters JSON allows unescaped (U+2028, \x1c, ...), and shift the line numbers.
  for number, raw in enumerate(data.split(b"\n"), 1):
    where = f"{flag} line {number}: "
    if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
      raw = raw[3:]  # A byte-order mark, which Windows editors write.
    try:
      line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise UsageError(f"{where}byte {e.start + 1} (0x{raw[e.start]:02x}) is not UTF-8; save "
                       "the file as UTF-8") from None
    if not line.strip():
      continue
    fields = _parsed(where, line)
    requests.append(Request(source=f"{name}:{number}", **_checked_fields(where, fields)))
  if not requests:
    raise UsageError(f"{flag}: holds no requests; {fix}")
  return requests


class _Duplicate(Exception):
  pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
  """A JSON object, refusing a key given twice (json.loads keeps the last one silently)."""
  result = {}
  for key, value in pairs:
    if key in result:
      raise _Duplicate(key)
    result[key] = value
  return result


def _parsed(where: str, line: str) -> dict[str, Any]:
  try:
    fields = json.loads(line, object_pairs_hook=_no_duplicates)
  except _Duplicate as e:
    raise UsageError(f"{where}field {shown(e.args[0])} is given twice; keep one") from None
  except json.JSONDecodeError as e:
    raise UsageError(f"{where}{shown(line.strip())} is not JSON ({e.msg} at column "
                     f"{e.colno}); write one JSON object per line, e.g. {_EXAMPLE}") from None
  except (ValueError, RecursionError) as e:  # An int of > 4300 digits; nesting too deep.
    problem = "nests too deeply" if isinstance(e, RecursionError) else str(e).split("\n")[0]
    raise UsageError(f"{where}is not a request ({problem}); write one JSON object per line, "
                     f"e.g. {_EXAMPLE}") from None
  if not isinstance(fields, dict):
    raise UsageError(f"{where}{shown(fields)} is {_kind(fields)}, not a JSON object; write one "
                     f"object per line, e.g. {_EXAMPLE}")
  return fields


def _one_line(text: str) -> str:
  """A path as given, for messages: as is when printable and short, else `shown()`'s form."""
  if text.isprintable() and len(text) <= 200:
    return text
  return shown(text)


# ----------------------------------------------------------------------------- answers


@dataclasses.dataclass(frozen=True)
class Completion:
  """One request's answer, as the generator produced it (see the module doc's schema)."""

  request: Request
  prompt_ids: tuple[int, ...]
  prompt_text: str | None
  completion_ids: tuple[int, ...]
  completion_text: str | None
  logprobs: tuple[float, ...]
  stop_reason: str
  stop_string: str | None
  settings: dict
  checkpoint_step: int
  prefill_seconds: float
  decode_seconds: float


def tokens_per_second(completion: Completion) -> float | None:
  """The decode rate after the first token (which the prefill made); None if undefined."""
  seconds = completion.decode_seconds
  if len(completion.completion_ids) < 2 or not (math.isfinite(seconds) and seconds > 0):
    return None
  return (len(completion.completion_ids) - 1) / seconds


def record(completion: Completion, index: int) -> dict[str, Any]:
  """The JSON object of `completion`, schema 1 (see the module doc); strict JSON throughout.

  Raises:
    ValueError: an unknown stop_reason, or logprobs not one per completion token: the
      generator's bug, not the user's.
  """
  if completion.stop_reason not in STOP_REASONS:
    raise ValueError(f"stop_reason={completion.stop_reason!r}: not one of {STOP_REASONS}")
  if len(completion.logprobs) != len(completion.completion_ids):
    raise ValueError(f"{len(completion.logprobs)} logprobs for "
                     f"{len(completion.completion_ids)} completion tokens")
  return {
      "schema_version": SCHEMA_VERSION,
      "index": int(index),
      "source": completion.request.source,
      "prompt": completion.prompt_text,
      # int(): the generator's ids may be numpy ints, which json cannot write.
      "prompt_ids": [int(token) for token in completion.prompt_ids],
      "completion": completion.completion_text,
      "completion_ids": [int(token) for token in completion.completion_ids],
      "logprobs": [_finite(value) for value in completion.logprobs],
      "stop_reason": completion.stop_reason,
      "stop_string": completion.stop_string,
      "settings": _json_safe(dict(completion.settings)),
      "checkpoint_step": (None if completion.checkpoint_step is None
                          else int(completion.checkpoint_step)),
      "timing": {
          "prefill_seconds": _finite(completion.prefill_seconds),
          "decode_seconds": _finite(completion.decode_seconds),
          "tokens_per_second": _finite(tokens_per_second(completion)),
      },
  }


def _finite(value: Any) -> float | None:
  if value is None:
    return None
  value = float(value)
  return value if math.isfinite(value) else None


def _json_safe(value: Any) -> Any:
  """Settings as JSON writes them strictly: tuples as lists, numpy scalars as Python's."""
  if isinstance(value, Mapping):
    return {str(key): _json_safe(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_safe(item) for item in value]
  if isinstance(value, bool) or value is None or isinstance(value, str):
    return value
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    return _finite(value)
  return str(value)


def format_human(completion: Completion) -> str:
  """A few lines for a person at a terminal: source, why it stopped, rate; prompt, completion.

  Text is shown as it is (newlines indented under its label), but with other control
  characters escaped, so that no completion can move the cursor or recolor the terminal.
  """
  reason = completion.stop_reason
  if reason == "stop":
    reason = f"stop string {shown(completion.stop_string)}"
  rate = tokens_per_second(completion)
  count = len(completion.completion_ids)
  header = (f"{completion.request.source}: {count} token{'s' if count != 1 else ''}, "
            f"stopped at {reason}" + (f", {rate:.1f} tokens/s" if rate is not None else ""))

  def shown_text(text: str | None, ids: tuple[int, ...]) -> str:
    if text is None:
      return str([int(token) for token in ids])
    printable = "".join(ch if ch.isprintable() or ch in "\n\t" else ch.encode(
        "unicode_escape").decode("ascii") for ch in text)
    return printable.replace("\n", "\n              ")

  return (f"{header}\n  prompt:     {shown_text(completion.prompt_text, completion.prompt_ids)}"
          f"\n  completion: "
          f"{shown_text(completion.completion_text, completion.completion_ids)}")


# ----------------------------------------------------------------------------- writing answers


class CompletionWriter:
  """Writes each completion's record as a JSON line, as it comes; a context manager.

  `destination`:
    "-"         JSON lines on stdout (always JSON, terminal or not: stdout is then the
                machine-readable output, and the program's own messages must go to stderr).
    "" or None  JOB/decode/<UTC time>.jsonl, e.g. JOB/decode/20261201T201913Z.jsonl, with a
                -2, -3, ... suffix where that name is taken.
    a path      that file (relative to the working directory); its folder must exist, and
                the file must not: nothing is ever overwritten.

  A file is written as `<name>.partial`, a line per completion, flushed, so a user can watch
  it; it gets its name on a clean exit of the `with` block. A killed or failed run so leaves
  a `.partial` file (or none, if it had written nothing) that no reader takes for a whole
  answer set, as a file written in place would look after a kill between two lines. The
  `.partial` name is created exclusively, so two runs can never write one file. When stdout
  is a terminal, each completion written to a file is also printed in `format_human`'s form.
  """

  def __init__(self, destination: str | None, job_dir: epath.Path | None,
               shown_job_dir: str | None, now: Callable[[], float] = time.time):
    self._count = 0
    self._file = None
    self._partial: epath.Path | None = None
    self._path: epath.Path | None = None
    if destination == "-":
      self._echo = False
      return
    if destination:
      flag = f"--decode_out={_one_line(destination)}"
      path = paths.resolve(destination, "--decode_out")
      if destination.endswith("/") or path.is_dir():
        raise UsageError(f"{flag}: is a directory; give a file name, e.g. "
                         f"{_one_line(destination.rstrip('/'))}/answers.jsonl")
      if not path.parent.is_dir():
        raise UsageError(f"{flag}: its folder {_one_line(str(path.parent))} does not exist; "
                         "create it, or give a path in an existing folder")
      if path.exists():
        raise UsageError(f"{flag}: already exists, and is never overwritten; give a new "
                         "path, or move the file away")
      self._open(flag, path, exclusive_fix="another decode is writing it, or a killed one "
                 "left it; move it away, or give another path")
    else:
      if job_dir is None:
        raise UsageError("--decode_out=: no job dir to write completions into; pass "
                         "--job_log_dir=JOB, or --decode_out=FILE (or - for stdout)")
      folder = job_dir / "decode"
      shown_folder = f"{_one_line(shown_job_dir or str(job_dir))}/decode"
      try:
        folder.mkdir(parents=True, exist_ok=True)
      except OSError as e:
        raise UsageError(f"--job_log_dir={_one_line(shown_job_dir or str(job_dir))}: cannot "
                         f"create {shown_folder} ({e.strerror or type(e).__name__}); make "
                         "the job dir writable, or pass --decode_out=FILE") from None
      stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now()))
      for suffix in range(1, 10_000):
        path = folder / (f"{stamp}.jsonl" if suffix == 1 else f"{stamp}-{suffix}.jsonl")
        if not path.exists() and self._open(f"--job_log_dir={shown_folder}", path):
          break
      else:
        raise UsageError(f"--job_log_dir={shown_folder}: every name for {stamp} is taken; "
                         "pass --decode_out=FILE")
    self._echo = _is_terminal(sys.stdout)

  def _open(self, flag: str, path: epath.Path, exclusive_fix: str | None = None) -> bool:
    """Creates `path`.partial to write; False if it exists and `exclusive_fix` is None."""
    partial = path.parent / f"{path.name}.partial"
    try:
      if paths.is_remote(str(partial)):
        if partial.exists():
          raise FileExistsError(partial)
        self._file = partial.open("w")  # No exclusive create there; a check is what remains.
      else:
        self._file = open(os.fspath(partial), "x", encoding="utf-8")
    except FileExistsError:
      if exclusive_fix is None:
        return False
      raise UsageError(f"{flag}: {_one_line(partial.name)} exists: {exclusive_fix}") from None
    except OSError as e:
      raise UsageError(f"{flag}: cannot be written ({e.strerror or type(e).__name__}); give "
                       "a path in a writable folder") from None
    self._partial, self._path = partial, path
    return True

  @property
  def path(self) -> epath.Path | None:
    """The file's final name (it is `<name>.partial` until the close); None for stdout."""
    return self._path

  @property
  def count(self) -> int:
    """How many completions were written."""
    return self._count

  def write(self, completion: Completion, index: int) -> None:
    """Writes `completion`'s record as one line, flushed; at a terminal, a human form too."""
    row = record(completion, index)
    if self._file is None:
      # ASCII escapes on stdout: its encoding may not be UTF-8 (LANG=C), and JSON needs none.
      print(json.dumps(row, allow_nan=False), flush=True)
    else:
      # UTF-8 in the file; a lone surrogate (no decoder should make one) becomes its JSON
      # escape (\udcff) rather than an error after the decode is done.
      line = json.dumps(row, allow_nan=False, ensure_ascii=False)
      self._file.write(line.encode("utf-8", "backslashreplace").decode("utf-8") + "\n")
      self._file.flush()
      if self._echo:
        text = format_human(completion)
        encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
        print(text.encode(encoding, "backslashreplace").decode(encoding), flush=True)
    self._count += 1

  def close(self, succeeded: bool = True) -> None:
    """Gives the file its name if `succeeded`; else leaves the `.partial` (if it has lines)."""
    if self._file is None:
      return
    self._file.close()
    self._file = None
    if not succeeded:
      if self._count == 0:
        self._partial.unlink()  # Nothing in it to keep.
      return
    self._partial.rename(self._path)

  def __enter__(self) -> CompletionWriter:
    return self

  def __exit__(self, kind, value, traceback) -> None:
    self.close(succeeded=kind is None)


def _is_terminal(stream: Any) -> bool:
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):  # A replaced or closed stdout.
    return False
