"""Decode requests: what `--mode=decode` is asked to generate, read and checked before it runs.

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

What the generator answers, and how it is written: lingvo_lite/decode/records.py.

The bounds of each sampling setting are decode/sampling_checks.py's, shared with the config's
`decode.*` defaults.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import numbers
from typing import Any, Mapping, Sequence

from lingvo_lite import input_files, paths
from lingvo_lite.decode.sampling_checks import check_sampling, check_unicode, kind
from lingvo_lite.errors import UsageError, config_error, shown

REQUEST_FIELDS = ("prompt", "prompt_ids", "max_new_tokens", "temperature", "top_k", "top_p",
                  "seed", "stop")

_INT64_LIMIT = 2**63  # Token ids: JAX computes with at most int64.
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
      raise config_error(f"{where}prompt", prompt, f"must be a string, not {kind(prompt)}",
                         'give the text to continue, or "prompt_ids" for token ids')
    if not prompt:
      raise config_error(f"{where}prompt", prompt, "is empty", "give the text to continue")
    check_unicode(f"{where}prompt", prompt, prompt)
  if ids is not None:
    fix = "give a non-empty list of token ids (ints >= 0), e.g. [1, 42]"
    if not isinstance(ids, (list, tuple)) or not ids:
      problem = ("is empty" if isinstance(ids, (list, tuple))
                 else f"must be a list, not {kind(ids)}")
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
    check_unicode(where, prompt, prompt)
    requests.append(Request(source=where, prompt=prompt))
  if prompts_file:
    requests.extend(_read_file(prompts_file, shown_file or prompts_file))
  if not requests:
    raise UsageError("no prompts to decode: pass --prompt=TEXT (repeatable) or "
                     f"--prompts_file=FILE.jsonl (one JSON object per line, e.g. {_EXAMPLE})")
  return requests


def _read_file(text: str, name: str) -> list[Request]:
  name = one_line(name)
  flag = f"--prompts_file={name}"
  path = paths.resolve(text, "--prompts_file")
  fix = f"give a JSON-lines file of requests, one object per line, e.g. {_EXAMPLE}"
  try:
    if not path.exists():
      raise UsageError(f"{flag}: no such file; {fix}")
    if path.is_dir():
      raise UsageError(f"{flag}: is a directory; {fix}")
    # Read once, start to end: a pipe being written (`<(...)`) is read whole; a FIFO no
    # program writes to, or a device, is refused rather than waited on.
    data = input_files.read_bytes(path, flag, fix, stream=True)
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
    raise UsageError(f"{where}{shown(fields)} is {kind(fields)}, not a JSON object; write one "
                     f"object per line, e.g. {_EXAMPLE}")
  return fields


def one_line(text: str) -> str:
  """A path as given, for messages: as is when printable and short, else `shown()`'s form."""
  if text.isprintable() and len(text) <= 200:
    return text
  return shown(text)
