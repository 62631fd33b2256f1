"""The reward registry: reward functions by name, and scoring a completion with several of them.

A reward function is `fn(record, completion) -> float`: the prompt's record (its `id`, its
`prompt` or `messages`, and whatever the reward reads: an `answer`, `tests`) and the text a
policy wrote. It is registered under a name, as experiments are (config/registry.py): a
decorator records it, a name is looked up, and an unknown name is refused in one line with the
valid choices (and the closest ones). A name not registered that is a dotted path
(`my_project.rewards.brevity`) imports its module first, whose `@register` then names it, so a
project's own rewards need no edit here. The built-ins are one module each in this package,
imported by its `__init__`: `exact_answer`, `answer_format`, `code_tests`.

`score(specs, record, completion)` calls each `(name, weight)` of `specs` and adds the weighted
values. A reward that fails scores 0 and is counted, never raised and never NaN: one that raises
(anything but Ctrl-C), returns something other than a real number, returns a non-finite value,
or runs past its time limit. Each failure is one line in `ScoredCompletion.failures` naming the
function, the prompt's id and why; the caller counts them per step and warns once
(`failure_warning`). Why 0 and go on rather than stop the run: one bad completion (a regex
that meets text nobody foresaw, a test that hangs) would otherwise end hours of training, and a
reward that fails for every completion shows as its per-function mean pinned at 0 and a failure
count equal to the completions, in the first step's log line.

The time limit (`register(..., limit_s=)`) is kept two ways. Called from the main thread, a
timer (SIGALRM) interrupts the function's Python code at the limit, and again every
`_REPEAT_S` after, in case it swallowed the first interruption; the caller's own timer, if one
is running, is left alone and only the second way applies. Whatever the thread, a call that
took longer than its limit scores 0 whatever it returned. Neither stops code that never returns
to Python (a C loop); code that may run away (a completion's program) belongs in a subprocess
with limits of its own, as `code_tests` runs it (`sandbox.py`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import signal
import threading
import time
from typing import Callable, Sequence, TypeVar

from lingvo_lite.errors import UsageError, config_error, one_line, shown
from lingvo_lite.runtime import user_code

RewardFn = Callable[[dict, str], float]
F = TypeVar("F", bound=Callable[..., float])

# Seconds a reward may take per completion unless it registers a limit of its own: a string
# check takes microseconds, so this only ever meets a function that hangs.
DEFAULT_LIMIT_S = 10.0
# After the first interruption, again this often, for a function that caught the first.
_REPEAT_S = 0.25
# Longest failure reason kept (a raised message can be any length).
_REASON_CHARS = 300


@dataclasses.dataclass(frozen=True)
class Reward:
  """A registered reward function.

  Attributes:
    name: What configs call it.
    fn: `fn(record, completion) -> float`.
    limit_s: Seconds one call may take before it scores 0 as a failure.
    fields: The record fields it reads (beyond `id`), for a prompt set's check.
  """
  name: str
  fn: RewardFn
  limit_s: float = DEFAULT_LIMIT_S
  fields: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ScoredCompletion:
  """One completion's rewards.

  Attributes:
    total: The weighted sum of `per_function` (0 for each failure).
    per_function: Name -> the function's unweighted value (0 where it failed).
    failures: One line per function that failed: its name, the prompt's id and why.
  """
  total: float
  per_function: dict[str, float]
  failures: list[str]


_REGISTRY: dict[str, Reward] = {}


def register(name: str, *, limit_s: float = DEFAULT_LIMIT_S,
             fields: Sequence[str] = ()) -> Callable[[F], F]:
  """Decorator that registers `fn(record, completion) -> float` under `name`.

  Args:
    name: The name configs use: a Python identifier, or dotted identifiers.
    limit_s: Seconds one call may take (see the module doc).
    fields: The record fields the function reads, checked by a prompt set's `check`.

  Raises:
    ValueError: a bad name or limit, or a second function under one name (a programming
      error, met when the module is imported).
  """
  if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
    raise ValueError(f"reward name {shown(name)} is not an identifier or dotted identifiers")
  if not (isinstance(limit_s, numbers.Real) and math.isfinite(limit_s) and limit_s > 0):
    raise ValueError(f"reward {name}: limit_s={shown(limit_s)} is not a positive number")

  def decorate(fn: F) -> F:
    existing = _REGISTRY.get(name)
    if existing is not None and _qualified(existing.fn) != _qualified(fn):
      raise ValueError(f"reward name {name!r} is registered twice: by "
                       f"{_qualified(existing.fn)} and {_qualified(fn)}")
    _REGISTRY[name] = Reward(name, fn, float(limit_s), tuple(fields))
    return fn

  return decorate


def _qualified(fn: Callable) -> str:
  return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def names() -> list[str]:
  """Every registered reward's name, sorted."""
  return sorted(_REGISTRY)


def reward(name: str, field: str = "rewards") -> Reward:
  """The registered `Reward` named `name` (see `get`)."""
  if not isinstance(name, str) or not name.strip():
    raise config_error(field, name, "is not a reward's name", _choices())
  found = _REGISTRY.get(name)
  if found is None and "." in name and all(p.isidentifier() for p in name.split(".")):
    _import_owner(name, field)
    found = _REGISTRY.get(name)
  if found is None:
    close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise config_error(field, name, "no reward function of that name is registered",
                       hint + _choices())
  return found


def get(name: str, field: str = "rewards") -> RewardFn:
  """The reward function registered as `name`.

  Args:
    name: A registered name, or a dotted path whose module registers it when imported.
    field: The config path the name came from, which the error names.

  Raises:
    UsageError: `<field>='<name>': no reward function of that name is registered; valid
      choices: ...` (or its module failed to import).
  """
  return reward(name, field).fn


def _choices() -> str:
  return (f"valid choices: {', '.join(names())} (or a function of your own, registered with "
          "@lingvo_lite.rewards.registry.register(NAME) in a module named by its dotted path)")


def _import_owner(name: str, field: str) -> None:
  """Imports the longest module prefix of `name` that exists, so its `@register` runs."""
  parts = name.split(".")
  for end in range(len(parts) - 1, 0, -1):
    module = ".".join(parts[:end])
    try:
      if user_code.import_module(module) is not None:
        return
    except user_code.ImportFailed as e:
      raise config_error(field, name, f"importing module {module} failed: {e}") from None


def check(specs: Sequence[tuple[str, float]], field: str = "rewards") -> None:
  """Refuses what `score` could not use: an empty list, a name not registered, a name given
  twice, a weight that is not a finite number.

  Raises:
    UsageError: naming `field[i]`, the value and the fix.
  """
  if isinstance(specs, (str, bytes)) or not isinstance(specs, Sequence) or not specs:
    raise config_error(field, specs, "give a non-empty list of (reward name, weight) pairs",
                       "e.g. [('exact_answer', 1.0), ('answer_format', 0.1)]; " + _choices())
  seen = set()
  for index, spec in enumerate(specs):
    where = f"{field}[{index}]"
    if not isinstance(spec, (tuple, list)) or len(spec) != 2:
      raise config_error(where, spec, "is not a (reward name, weight) pair",
                         "e.g. ('exact_answer', 1.0)")
    name, weight = spec
    reward(name, where)
    if name in seen:
      raise config_error(where, spec, f"names {name!r} a second time", "give each reward once")
    seen.add(name)
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(
        weight):
      raise config_error(where, spec, "the weight is not a finite number", "e.g. 1.0")


def required_fields(specs: Sequence[tuple[str, float]]) -> tuple[str, ...]:
  """The record fields the rewards of `specs` read (each once, in order)."""
  found: dict[str, None] = {}
  for name, _ in specs:
    found.update(dict.fromkeys(reward(name).fields))
  return tuple(found)


def score(specs: Sequence[tuple[str, float]], record: dict, completion: str
          ) -> ScoredCompletion:
  """`completion`'s rewards: each function of `specs` called on (record, completion), its
  value weighted and added; a failure scores 0 and is one line of `failures` (module doc).

  Raises:
    UsageError: specs that `check` refuses.
  """
  check(specs)
  per_function: dict[str, float] = {}
  failures: list[str] = []
  total = 0.0
  for name, weight in specs:
    value, why = _call(reward(name), record, completion)
    if why is not None:
      failures.append(one_line(f"reward {name} on prompt {_prompt_id(record)}: {why}; "
                               "scored 0"))
      value = 0.0
    per_function[name] = value
    total += float(weight) * value
  if not math.isfinite(total):  # Finite values and weights whose products overflow.
    failures.append(one_line(f"rewards on prompt {_prompt_id(record)}: the weighted sum of "
                             f"{shown(per_function, 120)} overflows; scored 0"))
    total = 0.0
  return ScoredCompletion(total, per_function, failures)


def failure_warning(scored: Sequence[ScoredCompletion]) -> str | None:
  """One line for a batch's failed rewards (how many, and the first), or None if none."""
  failures = [line for item in scored for line in item.failures]
  if not failures:
    return None
  return (f"{len(failures)} reward call(s) of {len(scored)} completion(s) failed and scored 0 "
          f"(first: {failures[0]})")


def _prompt_id(record: object) -> str:
  return shown(record.get("id", "?") if isinstance(record, dict) else "?", 80)


class _PastLimit(BaseException):
  """Raised into a reward at its limit; a BaseException, so `except Exception` in it won't
  swallow it."""


def _call(found: Reward, record: dict, completion: str) -> tuple[float, str | None]:
  """(value, None), or (0, why it failed)."""
  start = time.monotonic()
  try:
    value = _limited(found.fn, record, completion, found.limit_s)
  except _PastLimit:
    return 0.0, f"ran past its {found.limit_s:g} s limit"
  except KeyboardInterrupt:
    raise
  except BaseException as e:  # pylint: disable=broad-except
    # Anything of the function's: SystemExit and GeneratorExit too, never the run's end.
    return 0.0, f"raised {user_code.describe(e)[:_REASON_CHARS]}"
  elapsed = time.monotonic() - start
  if elapsed > found.limit_s:
    return 0.0, f"ran {elapsed:.1f} s, past its {found.limit_s:g} s limit"
  if isinstance(value, bool):
    return float(value), None
  if not isinstance(value, numbers.Real):
    return 0.0, f"returned {shown(value, 80)}, not a number"
  try:
    value = float(value)
  except (TypeError, ValueError, OverflowError) as e:
    return 0.0, f"returned {shown(value, 80)}, not a float ({e})"
  if not math.isfinite(value):
    return 0.0, f"returned {value}, not a finite number"
  return value, None


def _limited(fn: RewardFn, record: dict, completion: str, limit_s: float) -> object:
  """`fn(record, completion)`, interrupted at `limit_s` where a timer can be set (the main
  thread, no timer of the caller's running)."""
  if (threading.current_thread() is not threading.main_thread()
      or signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0)):
    return fn(record, completion)
  armed = [True]

  def on_alarm(signum, frame):
    del signum, frame
    if armed[0]:  # A tick that lands after the call returned is ignored.
      raise _PastLimit()

  previous = signal.signal(signal.SIGALRM, on_alarm)
  try:
    signal.setitimer(signal.ITIMER_REAL, limit_s, _REPEAT_S)
    return fn(record, completion)
  finally:
    armed[0] = False
    signal.setitimer(signal.ITIMER_REAL, 0)
    # None: a handler installed outside Python, which Python cannot put back; the default.
    signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
