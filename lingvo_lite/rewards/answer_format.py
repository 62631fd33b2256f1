"""The format reward: 1 when a completion ends with exactly one non-empty tagged answer.

A completion is well formed when it holds one `<answer>` and one `</answer>` (exact_answer.py's
`TAG`), the opening one first, with something other than white space between them, and
nothing but white space after the closing one: reasoning first, then the answer, then the end.
It reads no record field, so it rewards the shape alone (DeepSeek-R1's format reward); weighted
small beside `exact_answer`, it teaches a model where to put its answer before it can answer.
"""

from __future__ import annotations

from lingvo_lite.rewards.exact_answer import TAG
from lingvo_lite.rewards.registry import register

_OPEN, _CLOSE = f"<{TAG}>", f"</{TAG}>"


def well_formed(completion: str) -> bool:
  """Whether `completion` ends with its one non-empty tagged answer (module doc)."""
  if completion.count(_OPEN) != 1 or completion.count(_CLOSE) != 1:
    return False
  start, end = completion.find(_OPEN), completion.find(_CLOSE)
  inside = completion[start + len(_OPEN):end]
  return start < end and bool(inside.strip()) and not completion[end + len(_CLOSE):].strip()


@register("answer_format")
def answer_format(record: dict, completion: str) -> float:
  """1.0 when the completion is well formed (module doc), else 0.0."""
  del record  # The shape alone.
  return float(well_formed(completion))
