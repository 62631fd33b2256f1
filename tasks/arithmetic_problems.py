"""Procedurally generated multi-step arithmetic word problems, with the answer in a tag: a
verifiable task for reinforcement learning (the `exact_answer` and `answer_format` rewards).

  Mia has 12 apples. She buys 3 bags with 5 apples in each. She gives 7 apples to Leo. How
  many apples does Mia have now? Work it out step by step, then give the final answer as a
  number inside <answer></answer> tags.                                       (answer: 20)

A problem starts from a quantity and applies `steps` operations to it (add, take away, add
equal groups, multiply, split into equal piles and keep one), each a sentence, every intermediate
a whole number from 0 to `_MAX_QUANTITY`. Its record (data/prompt_data.py's format) holds the
prompt, the integer `answer`, the step count and a reference `completion` that works it out and
ends with the tagged answer (for SFT on the same problems, or a check of the rewards).

Splits are disjoint by construction, whatever the seeds and counts: a problem's arithmetic
(its numbers and operations, names and items apart) is hashed, and one bucket in
`HELD_OUT_BUCKETS` is held out: a held-out problem never shares its arithmetic with any train
problem. Within a split the seed chooses the problems (`random.Random` seeded with the split
and the seed: the same on every machine and Python version 3.2 on), each problem once.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Callable

SPLITS = ("train", "held_out")
HELD_OUT_BUCKETS = 10  # One hash bucket in ten is held out.
INSTRUCTION = ("Work it out step by step, then give the final answer as a number inside "
               "<answer></answer> tags.")
# The optional system string (`generate(one_shot=True)`): the format stated, with one worked
# example, as R1-Zero-style templates show it. SmolLM2-135M-Instruct never uses the tags from
# the instruction alone (README, "GRPO"); a worked example makes it use them sometimes, which
# is what GRPO needs to start from (a group whose completions all score 0 teaches nothing).
# The example's arithmetic has two steps; it is fixed text, not drawn from either split.
ONE_SHOT_SYSTEM = (
    "Solve the word problem step by step, one short line per step, then give the final answer "
    "as a number inside <answer></answer> tags and stop.\n\nExample:\n"
    "Problem: Sam has 7 coins. He finds 5 more coins. He gives 3 coins to Kim. How many coins "
    "does Sam have now?\n"
    "Solution:\nSam starts with 7 coins.\n7 + 5 = 12.\n12 - 3 = 9.\n<answer>9</answer>")
_MAX_QUANTITY = 999
_MAX_DRAWS = 100  # Operations drawn for one problem before it is given up (`_arithmetic`).
# The most problems one call makes, all held in memory: 20,000 take about 2 s; a count past
# this would run for hours and fill the memory before it could fail.
MAX_COUNT = 100_000
_NAMES = (("Mia", "She"), ("Leo", "He"), ("Ava", "She"), ("Noah", "He"), ("Zoe", "She"),
          ("Omar", "He"), ("Lena", "She"), ("Ravi", "He"), ("Iris", "She"), ("Tom", "He"))
_ITEMS = ("apples", "marbles", "stickers", "pencils", "coins", "cookies", "books", "stamps",
          "shells", "cards")


def _add(rng, quantity, max_number):
  return ("add", rng.randint(2, max_number))


def _take(rng, quantity, max_number):
  return ("take", rng.randint(1, min(quantity, max_number))) if quantity >= 2 else None


def _groups(rng, quantity, max_number):
  return ("groups", rng.randint(2, 5), rng.randint(2, max_number))


def _times(rng, quantity, max_number):
  return ("times", rng.randint(2, 3)) if quantity else None


def _share(rng, quantity, max_number):
  divisors = [k for k in range(2, 7) if quantity and quantity % k == 0]
  return ("share", rng.choice(divisors)) if divisors else None


# Each kind of operation by its name (`generate(operations=...)`: easy problems add and take).
_OPERATIONS: dict[str, Callable] = {"add": _add, "take": _take, "groups": _groups,
                                    "times": _times, "share": _share}
OPERATIONS = tuple(_OPERATIONS)


def _apply(quantity: int, operation: tuple) -> tuple[int, str]:
  """The quantity after `operation`, and the line of the reference solution that computes it."""
  kind, *numbers = operation
  if kind == "add":
    value, line = quantity + numbers[0], f"{quantity} + {numbers[0]}"
  elif kind == "take":
    value, line = quantity - numbers[0], f"{quantity} - {numbers[0]}"
  elif kind == "groups":
    value = quantity + numbers[0] * numbers[1]
    line = f"{quantity} + {numbers[0]} * {numbers[1]}"
  elif kind == "times":
    value, line = quantity * numbers[0], f"{quantity} * {numbers[0]}"
  else:
    value, line = quantity // numbers[0], f"{quantity} / {numbers[0]}"
  return value, f"{line} = {value}."


def _sentence(operation: tuple, pronoun: str, items: str, friend: str) -> str:
  kind, *numbers = operation
  if kind == "add":
    return f"{pronoun} finds {numbers[0]} more {items}."
  if kind == "take":
    return f"{pronoun} gives {numbers[0]} {items} to {friend}."
  if kind == "groups":
    return f"{pronoun} buys {numbers[0]} bags with {numbers[1]} {items} in each."
  if kind == "times":
    change = "doubles" if numbers[0] == 2 else "triples"
    return f"Then the number of {items} {pronoun.lower()} has {change}."
  return (f"{pronoun} splits the {items} into {numbers[0]} equal piles and keeps one "
          "pile.")


def _arithmetic(rng: random.Random, steps: int, max_number: int,
                kinds: tuple[Callable, ...]) -> tuple[int, list[tuple]] | None:
  """A start and `steps` operations of `kinds`, every intermediate in [0, _MAX_QUANTITY]; None
  when `_MAX_DRAWS` draws found no operation that applies (kinds that need what the quantity
  lacks, e.g. only piles of a prime), so no choice of kinds can loop forever."""
  start = rng.randint(2, max_number)
  quantity, operations = start, []
  for _ in range(_MAX_DRAWS):
    if len(operations) == steps:
      break
    operation = rng.choice(kinds)(rng, quantity, max_number)
    if operation is None:
      continue
    value, _ = _apply(quantity, operation)
    if 0 <= value <= _MAX_QUANTITY:
      operations.append(operation)
      quantity = value
  return (start, operations) if len(operations) == steps else None


def bucket(start: int, operations: list[tuple]) -> int:
  """The hash bucket of a problem's arithmetic: 0 is held out."""
  text = json.dumps([start, [list(op) for op in operations]])
  return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % HELD_OUT_BUCKETS


def _record(split: str, seed: int, index: int, rng: random.Random, start: int,
            operations: list[tuple], one_shot: bool) -> dict:
  (name, pronoun), items = rng.choice(_NAMES), rng.choice(_ITEMS)
  friend = rng.choice([other for other, _ in _NAMES if other != name])
  sentences = [f"{name} has {start} {items}."]
  lines = [f"{name} starts with {start} {items}."]
  quantity = start
  for operation in operations:
    sentences.append(_sentence(operation, pronoun, items, friend))
    quantity, line = _apply(quantity, operation)
    lines.append(line)
  sentences.append(f"How many {items} does {name} have now? {INSTRUCTION}")
  record = {"id": f"arithmetic-{split}-{seed}-{index}", "prompt": " ".join(sentences),
            "answer": quantity, "steps": len(operations),
            "completion": "\n".join(lines) + f"\n<answer>{quantity}</answer>"}
  return {"system": ONE_SHOT_SYSTEM, **record} if one_shot else record


def generate(split: str, count: int, seed: int = 0, min_steps: int = 2, max_steps: int = 3,
             max_number: int = 20, operations: tuple[str, ...] = OPERATIONS,
             one_shot: bool = False) -> list[dict]:
  """`count` distinct problems of `split` (module doc), the same for the same arguments.

  Args:
    split: "train" or "held_out".
    count: Problems to make.
    seed: Chooses the problems within the split.
    min_steps, max_steps: Operations per problem, drawn uniformly from this range.
    max_number: The largest number a sentence introduces (the start, an amount added); at
      most `_MAX_QUANTITY`, the largest quantity a problem holds.
    operations: The kinds of operation drawn from (`OPERATIONS`; the demo's easy problems:
      "add", "take"). With steps, max_number, the difficulty.
    one_shot: Give each record the `system` string `ONE_SHOT_SYSTEM` (the format, with a
      worked example); the problems themselves are the same.

  Raises:
    ValueError: a bad argument, or fewer distinct problems of the split than `count`.
  """
  if split not in SPLITS:
    raise ValueError(f"split={split!r}: valid splits: {', '.join(SPLITS)}")
  if not 1 <= min_steps <= max_steps:
    raise ValueError(f"min_steps={min_steps}, max_steps={max_steps}: need 1 <= min <= max")
  if max_number < 2 or count < 0:
    raise ValueError(f"max_number={max_number}, count={count}: need max_number >= 2, count "
                     ">= 0")
  if max_number > _MAX_QUANTITY:  # A start above it is never drawn: no problem would be found.
    raise ValueError(f"max_number={max_number}: at most {_MAX_QUANTITY}, the largest quantity "
                     "a problem holds")
  if count > MAX_COUNT:
    raise ValueError(f"count={count}: at most {MAX_COUNT:,} problems per set; make several "
                     "sets with different seeds for more")
  unknown = [kind for kind in operations if kind not in _OPERATIONS]
  if not operations or unknown or isinstance(operations, str):
    raise ValueError(f"operations={operations!r}: give one or more of "
                     f"{', '.join(OPERATIONS)}")
  kinds = tuple(_OPERATIONS[kind] for kind in dict.fromkeys(operations))
  rng = random.Random(f"arithmetic/{split}/{seed}")
  records, seen, attempts = [], set(), 0
  while len(records) < count:
    attempts += 1
    if attempts > 50 * count + 10_000:
      raise ValueError(f"only {len(records)} distinct {split} problems found for count={count} "
                       f"(max_number={max_number}, steps {min_steps}-{max_steps}, operations "
                       f"{','.join(operations)}); raise max_number or max_steps, allow more "
                       "operations, or ask for fewer")
    drawn = _arithmetic(rng, rng.randint(min_steps, max_steps), max_number, kinds)
    if drawn is None:
      continue
    start, steps = drawn
    key = json.dumps([start, [list(op) for op in steps]])
    if key in seen or (bucket(start, steps) == 0) != (split == "held_out"):
      continue
    seen.add(key)
    records.append(_record(split, seed, len(records), rng, start, steps, one_shot))
  return records
