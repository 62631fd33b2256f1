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
values; `score_many` scores a batch, calling the rewards that run their work in a subprocess
(`parallel=True`: `code_tests`) from several threads. A reward that fails (raises, returns no
finite real number, runs past its `limit_s`) scores 0 and is one line of
`ScoredCompletion.failures`, never raised and never NaN (calls.py: the policy, and why);
`failure_warning` makes a step's one warning of a batch's failures.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import difflib
import math
import numbers
from typing import Callable, Sequence, TypeVar

from lingvo_lite.errors import config_error, shown
from lingvo_lite.rewards import calls
from lingvo_lite.runtime import user_code

RewardFn = Callable[[dict, str], float]
F = TypeVar("F", bound=Callable[..., float])

# Seconds a reward may take per completion unless it registers a limit of its own: a string
# check takes microseconds, so this only ever meets a function that hangs.
DEFAULT_LIMIT_S = 10.0


@dataclasses.dataclass(frozen=True)
class Reward:
  """A registered reward function.

  Attributes:
    name: What configs call it.
    fn: `fn(record, completion) -> float`.
    limit_s: Seconds one call may take before it scores 0 as a failure.
    fields: The record fields it reads (beyond `id`), for a prompt set's check.
    parallel: Its calls may run on several threads at once (`score_many`): its work runs in
      a subprocess with a limit of its own, which a thread cannot interrupt.
  """
  name: str
  fn: RewardFn
  limit_s: float = DEFAULT_LIMIT_S
  fields: tuple[str, ...] = ()
  parallel: bool = False


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


def register(name: str, *, limit_s: float = DEFAULT_LIMIT_S, fields: Sequence[str] = (),
             parallel: bool = False) -> Callable[[F], F]:
  """Decorator that registers `fn(record, completion) -> float` under `name`.

  Args:
    name: The name configs use: a Python identifier, or dotted identifiers.
    limit_s: Seconds one call may take (see the module doc).
    fields: The record fields the function reads, checked by a prompt set's `check`.
    parallel: `score_many` may call it from several threads at once (`Reward.parallel`).

  Raises:
    ValueError: a bad name or limit, or a second function under one name (a programming
      error, met when the module is imported).
  """
  if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
    raise ValueError(f"reward name {shown(name)} is not an identifier or dotted identifiers")
  if not (isinstance(limit_s, numbers.Real) and math.isfinite(limit_s) and limit_s > 0):
    raise ValueError(f"reward {name}: limit_s={shown(limit_s)} is not a positive number")
  if isinstance(fields, str) or not all(isinstance(field, str) for field in fields):
    raise ValueError(f"reward {name}: fields={shown(fields)} is not a sequence of field names")

  def decorate(fn: F) -> F:
    existing = _REGISTRY.get(name)
    if existing is not None and _qualified(existing.fn) != _qualified(fn):
      raise ValueError(f"reward name {name!r} is registered twice: by "
                       f"{_qualified(existing.fn)} and {_qualified(fn)}")
    _REGISTRY[name] = Reward(name, fn, float(limit_s), tuple(fields), bool(parallel))
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
  found = [reward(name) for name, _ in specs]
  return ScoredCompletion(*calls.combined(specs, record, [
      calls.call(r.fn, r.limit_s, record, completion) for r in found]))


def score_many(specs: Sequence[tuple[str, float]], records: Sequence[dict],
               completions: Sequence[str], workers: int = 1) -> list[ScoredCompletion]:
  """`score` of each (record, completion) pair, the same results in the same order.

  The rewards registered `parallel=True` (those whose work runs in a subprocess of its own,
  as `code_tests`') are called from `workers` threads at once; the others on this thread one
  by one, where their time limit can interrupt them (module doc).

  Raises:
    UsageError: specs that `check` refuses.
    ValueError: as many records as completions are needed.
  """
  check(specs)
  if len(records) != len(completions):
    raise ValueError(f"{len(records)} records for {len(completions)} completions")
  found = [reward(name) for name, _ in specs]
  results = {(i, j): None for i in range(len(completions)) for j in range(len(found))}
  pooled = [(i, j) for i, j in results if found[j].parallel and workers > 1]
  with concurrent.futures.ThreadPoolExecutor(max(workers, 1)) as pool:
    futures = {(i, j): pool.submit(calls.call, found[j].fn, found[j].limit_s, records[i],
                                   completions[i]) for i, j in pooled}
    for i, j in results:
      if (i, j) not in futures:
        results[i, j] = calls.call(found[j].fn, found[j].limit_s, records[i], completions[i])
    for key, future in futures.items():
      results[key] = future.result()
  return [ScoredCompletion(*calls.combined(specs, records[i], [
      results[i, j] for j in range(len(found))])) for i in range(len(completions))]


def failure_warning(scored: Sequence[ScoredCompletion]) -> str | None:
  """One line for a batch's failed rewards (how many, and the first), or None if none."""
  failures = [line for item in scored for line in item.failures]
  if not failures:
    return None
  return (f"{len(failures)} reward call(s) of {len(scored)} completion(s) failed and scored 0 "
          f"(first: {failures[0]})")
