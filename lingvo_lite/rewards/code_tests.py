"""The code-execution reward: 1 when the completion's code passes the record's tests.

The record gives `tests`: Python source (or a list of lines) that raises when the code is
wrong (`assert add(2, 3) == 5`); optionally `entry_point`, the function's name, when the tests
define HumanEval's `check(candidate)` (then `check(<entry_point>)` is called after them), and
`code_prefix`, text put before the completion's code (HumanEval's prompt, for a model that
continues a function's signature). The completion's code is its first fenced block
(```` ```python ... ``` ````, or any fence) when it has one, else the whole completion.

The program (prefix, code, tests, the check call) runs in `sandbox.run_program` with `LIMITS`:
a fresh interpreter with time, memory and file limits, no network and no process creation
(sandbox.py, sandbox_child.py). It scores 1 if it runs to its end, else 0: a failing test, a
syntax error, a loop past its time, an allocation past its memory, a network or process call
are all 0, with no failure counted (they are the completion's faults, not the reward's). Only a
record without usable `tests`, or a child that cannot be started, is the reward's failure.
"""

from __future__ import annotations

import re

from lingvo_lite.rewards import sandbox
from lingvo_lite.rewards.registry import register

LIMITS = sandbox.Limits()
# The reward's own limit (registry.py): the program's, its interpreter's start, and slack; met
# only if the sandbox itself hangs.
_LIMIT_S = LIMITS.time_s + 10.0
_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)```", re.DOTALL)


def completion_code(completion: str) -> str:
  """The code of a completion: its first ```python (or first fenced) block, else all of it."""
  blocks = _FENCE.findall(completion) if "```" in completion else []
  for language, body in blocks:
    if language.lower() in ("python", "py", "python3"):
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


@register("code_tests", limit_s=_LIMIT_S, fields=("tests",))
def code_tests(record: dict, completion: str) -> float:
  """1.0 when the completion's code passes the record's tests in the sandbox, else 0.0."""
  return float(sandbox.run_program(program(record, completion), LIMITS).passed)
