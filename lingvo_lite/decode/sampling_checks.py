"""The bounds of a sampling setting, alike for the config's `decode.*` and for a request's.

`decode/settings.py` (the config's defaults) and `decode/requests.py` (a prompts file's line, a
`--prompt`) both refuse here what no decode can use, with the same one line.
"""

from __future__ import annotations

import math
import numbers

from lingvo_lite.errors import config_error, shown

_INT32_LIMIT = 2**31  # max_new_tokens and top_k become int32 arrays in the decode loop.
# As decode.seed's Range: decode/steps.py's key_data makes a key of both 32-bit halves on the host
# (jax.random.key(seed) itself would keep only the low 32 bits without jax_enable_x64).
_SEED_LIMIT = 2**63
# Temperature and top_p become float32: a larger temperature would be inf there, a smaller
# top_p 0 (or a subnormal), which the sampler refuses or divides by.
_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_TINY = 2.0**-126


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
    raise config_error(path, value, f"must be an int, not {kind(value)}", fix)
  if not low <= value < limit:
    bound = f">= {low}" if value < low else f"below 2**{limit.bit_length() - 1}"
    raise config_error(path, value, f"must be {bound}", fix)


def _check_number(where: str, name: str, value: object, fix: str) -> None:
  path = f"{where}{name}"
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise config_error(path, value, f"must be a number, not {kind(value)}", fix)
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
    raise config_error(path, stop, f"must be a list of strings, not {kind(stop)}", fix)
  for i, text in enumerate(stop):
    if not isinstance(text, str):
      raise config_error(path, stop, f"entry {i} is {shown(text)}, not a string", fix)
    if not text:
      raise config_error(path, stop, f"entry {i} is '', which would stop before any token",
                         "drop it")
    check_unicode(path, stop, text, f"entry {i} ")


def check_unicode(path: str, value: object, text: str, which: str = "") -> None:
  """Refuses lone surrogates (JSON's "\\ud800"; argv bytes that are not UTF-8): no tokenizer
  encodes them, and no UTF-8 output can hold them."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    bad = text[e.start]
    raise config_error(path, value, f"{which}holds {bad!r} at character {e.start}, which is not "
                       "text (a lone surrogate, or bytes that are not UTF-8)",
                       "give valid UTF-8 text") from None


def kind(value: object) -> str:
  name = type(value).__name__
  return {"NoneType": "null", "dict": "an object", "list": "a list", "str": "a string",
          "bool": "a bool", "float": "a float", "int": "an int"}.get(name, f"a {name}")
