"""The code-execution reward: 1 when the completion's code passes the record's tests.

The record gives `tests`: Python source (or a list of lines) that raises when the code is
wrong (`assert add(2, 3) == 5`); optionally `entry_point`, the function's name, when the tests
define HumanEval's `check(candidate)` (then `check(<entry_point>)` is called after them), and
`code_prefix`, text put before the completion's code (HumanEval's prompt, for a model that
continues a function's signature). The completion's code is its first ```` ```python ````
block (or its first fenced block of any language) when it has one, a fence left open running
to the end, else the whole completion.

The program (prefix, code, tests, the check call) runs in `sandbox.run_program` with `LIMITS`:
a fresh interpreter with time, memory and file limits, no network and no process creation
(sandbox.py, sandbox_child.py). It scores 1 if it runs to its end, else 0: a failing test, a
syntax error, a loop past its time, an allocation past its memory, a network or process call
are all 0, with no failure counted (they are the completion's faults, not the reward's). Only a
record without usable `tests`, or a child that cannot be started, is the reward's failure.
"""

from __future__ import annotations

from lingvo_lite.rewards import sandbox
from lingvo_lite.rewards.registry import register

LIMITS = sandbox.Limits()
# The reward's own limit (registry.py): the program's, its interpreter's start, and slack; met
# only if the sandbox itself hangs.
_LIMIT_S = LIMITS.time_s + 10.0
_FENCE = "```"
_PYTHON = ("python", "py", "python3")


def _blocks(text: str) -> list[tuple[str, str]]:
  """(language, body) of each fenced block, in order: a scan, linear in the text (a lazy
  regular expression would rescan the rest of the text from every unclosed fence)."""
  blocks, position = [], 0
  while (start := text.find(_FENCE, position)) >= 0:
    line_end = text.find("\n", start)
    if line_end < 0:
      break
    end = text.find(_FENCE, line_end + 1)
    header = text[start + len(_FENCE):line_end].strip()
    # A fence left open (a completion that stopped before closing it) runs to the end.
    body = text[line_end + 1:] if end < 0 else text[line_end + 1:end]
    blocks.append((header.split()[0].lower() if header else "", body))
    if end < 0:
      break
    position = end + len(_FENCE)
  return blocks


def completion_code(completion: str) -> str:
  """The code of a completion: its first ```python (or first fenced) block, else all of it."""
  blocks = _blocks(completion)
  for language, body in blocks:
    if language in _PYTHON:
      return body
  return blocks[0][1] if blocks else completion


def program(record: dict, completion: str) -> str:
  """The source run for `completion` against `record`'s tests (module doc).

  Raises:
    ValueError: the record has no usable `tests`, or a bad `entry_point` or `code_prefix`.
  """
  tests = record.get("tests")
  if isinstance(tests, list) and all(isinstance(line, str) for line in tests):
    tests = "\n".join(tests)
  if not isinstance(tests, str) or not tests.strip():
    raise ValueError("the record has no 'tests' (Python source, or a list of lines)")
  prefix = record.get("code_prefix", "")
  if not isinstance(prefix, str):
    raise ValueError(f"the record's 'code_prefix' is a {type(prefix).__name__}, not a string")
  source = f"{prefix}{completion_code(completion)}\n\n{tests}\n"
  entry_point = record.get("entry_point")
  if entry_point is not None:
    if not isinstance(entry_point, str) or not entry_point.isidentifier():
      raise ValueError(f"the record's 'entry_point' {entry_point!r:.80} is not a name")
    source += f"\ncheck({entry_point})\n"
  return source


@register("code_tests", limit_s=_LIMIT_S, fields=("tests",), parallel=True)
def code_tests(record: dict, completion: str) -> float:
  """1.0 when the completion's code passes the record's tests in the sandbox, else 0.0."""
  return float(sandbox.run_program(program(record, completion), LIMITS).passed)
