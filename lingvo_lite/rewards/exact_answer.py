"""The exact-answer reward: 1 when the completion's final tagged answer equals the record's.

The final answer is the text inside the completion's last `<answer>...</answer>` (`TAG`); a
completion with none scores 0. It equals the record's `answer` (a string or a number) when both
read as the same number, or else as the same text:

- as numbers: after dropping the surrounding spaces, a trailing full stop, a leading `$` and
  thousands separators (`1,234`), a decimal (`-12`, `3.50`, `.5`, `1e3`) or a fraction (`7/2`)
  is read exactly (`fractions.Fraction`), so `12`, `12.0`, `+12` and `24/2` are one answer and
  `0.1 + 0.2`'s float error cannot arise. A number longer than `_MAX_NUMBER_CHARS` or with an
  exponent beyond `_MAX_EXPONENT` is read as text, never computed (10**10**9 would take hours).
- as text: case and runs of white space apart.

The last tag counts, so a completion cannot hedge with several answers. Finding it is linear in
the completion's length (`str.rfind`, no regular expression that could backtrack).
"""

from __future__ import annotations

import fractions
import numbers
import re

from lingvo_lite.rewards.registry import register

TAG = "answer"
_OPEN, _CLOSE = f"<{TAG}>", f"</{TAG}>"
_MAX_NUMBER_CHARS = 64
_MAX_EXPONENT = 100
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?(\d+))?(/[+-]?\d+)?", re.IGNORECASE)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?")


def final_answer(completion: str) -> str | None:
  """The text inside the last `<answer>...</answer>` of `completion`, or None if it has none."""
  end = completion.rfind(_CLOSE)
  if end < 0:
    return None
  start = completion.rfind(_OPEN, 0, end)
  if start < 0:
    return None
  return completion[start + len(_OPEN):end]


def as_number(text: str) -> fractions.Fraction | None:
  """`text` read exactly as a number (module doc), or None if it is not one."""
  text = text.strip().rstrip(".").strip()
  if text.startswith("$"):
    text = text[1:].strip()
  if len(text) > _MAX_NUMBER_CHARS:
    return None
  if _THOUSANDS.fullmatch(text):
    text = text.replace(",", "")
  match = _NUMBER.fullmatch(text)
  if match is None or (match.group(3) and int(match.group(3)) > _MAX_EXPONENT):
    return None
  try:
    return fractions.Fraction(text)
  except (ValueError, ZeroDivisionError):
    return None


def _text(text: str) -> str:
  return " ".join(text.split()).casefold()


def same_answer(given: str, reference: object) -> bool:
  """Whether `given` (a completion's answer) equals `reference` (a record's `answer`).

  Raises:
    TypeError: `reference` is neither a string nor a real number.
  """
  if isinstance(reference, bool) or not isinstance(reference, (str, numbers.Real)):
    raise TypeError(f"the record's 'answer' is a {type(reference).__name__}, not a string or "
                    "a number")
  # A float's shortest repr is the number its writer meant (0.1, not 0.1000000000000000055).
  reference_text = reference if isinstance(reference, str) else repr(reference)
  expected = as_number(reference_text)
  if expected is not None:
    return as_number(given) == expected
  return _text(given) == _text(reference_text)


@register("exact_answer", fields=("answer",))
def exact_answer(record: dict, completion: str) -> float:
  """1.0 when the completion's final tagged answer equals `record['answer']`, else 0.0."""
  if "answer" not in record:
    raise KeyError("the record has no 'answer' field")
  given = final_answer(completion)
  return float(given is not None and same_answer(given, record["answer"]))
