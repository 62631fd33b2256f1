"""A small set of Python coding problems with generated tests, HumanEval-style: a verifiable
task for the `code_tests` reward (lingvo_lite/rewards/code_tests.py).

Each problem is a standard-library function: a signature, what it does, a reference solution,
and a generator of arguments. Its tests are made here: arguments drawn from a seeded
`random.Random` (and the edge cases listed), each expected value computed by running the
reference solution in this process (our own code, never a completion), written as HumanEval's
`check(candidate)` with the problem's name as `entry_point`. A result must equal the expected
one strictly (`_same`: the same built-in types all the way down, so an object that claims to
equal anything does not pass).

The held-out split is a fixed set of problems (`HELD_OUT`), disjoint from the train split's;
the seed draws the tests' arguments. A record (data/prompt_data.py's format) holds the prompt,
`tests`, `entry_point` and a reference `completion` (the solution in a fence).
"""

from __future__ import annotations

import random
from typing import Any, Callable, NamedTuple

SPLITS = ("train", "held_out")
# Each drawn case is a line of every record's `tests` and a call of the reference solution, all
# held in memory: 8 is the default, and a count past this would run for hours.
MAX_TESTS_PER_PROBLEM = 1000


class Problem(NamedTuple):
  name: str
  signature: str
  does: str
  solution: str
  arguments: Callable[[random.Random], tuple]
  edge_cases: tuple[tuple, ...] = ()


def _words(rng: random.Random, low: int = 0, high: int = 6) -> str:
  pool = ("apple", "Sky", "river", "stone", "BLUE", "moon", "tea", "a", "Level", "noon")
  return " ".join(rng.choice(pool) for _ in range(rng.randint(low, high)))


def _ints(rng: random.Random, low: int = 0, high: int = 8, span: int = 20) -> list[int]:
  return [rng.randint(-span, span) for _ in range(rng.randint(low, high))]


PROBLEMS: tuple[Problem, ...] = (
    Problem("reverse_words", "reverse_words(text: str) -> str",
            "returns the words of `text` (split on white space) in reverse order, joined by "
            "single spaces",
            "def reverse_words(text):\n    return ' '.join(reversed(text.split()))\n",
            lambda rng: (_words(rng),), (("",), ("  one  ",))),
    Problem("count_vowels", "count_vowels(text: str) -> int",
            "returns how many letters of `text` are vowels (a, e, i, o, u, in either case)",
            "def count_vowels(text):\n    return sum(c in 'aeiouAEIOU' for c in text)\n",
            lambda rng: (_words(rng),), (("",), ("xyz",))),
    Problem("is_palindrome", "is_palindrome(text: str) -> bool",
            "returns whether `text` reads the same backwards, ignoring case and every character "
            "that is not a letter or a digit",
            "def is_palindrome(text):\n    kept = [c.lower() for c in text if c.isalnum()]\n"
            "    return kept == kept[::-1]\n",
            lambda rng: (rng.choice(["Level", "noon", "Never odd or even", _words(rng, 1, 2)]),),
            (("",), ("A man, a plan, a canal: Panama",), ("ab",))),
    Problem("running_sum", "running_sum(numbers: list[int]) -> list[int]",
            "returns the list of running totals of `numbers` (the i-th is the sum of the first "
            "i + 1)",
            "def running_sum(numbers):\n    total, out = 0, []\n    for n in numbers:\n"
            "        total += n\n        out.append(total)\n    return out\n",
            lambda rng: (_ints(rng),), (([],),)),
    Problem("dedupe", "dedupe(items: list[int]) -> list[int]",
            "returns `items` without repeats, each kept where it first occurs",
            "def dedupe(items):\n    seen, out = set(), []\n    for x in items:\n"
            "        if x not in seen:\n            seen.add(x)\n            out.append(x)\n"
            "    return out\n",
            lambda rng: ([rng.randint(0, 5) for _ in range(rng.randint(0, 10))],), (([],),)),
    Problem("flatten", "flatten(lists: list[list[int]]) -> list[int]",
            "returns the items of the lists in `lists`, in order, as one list",
            "def flatten(lists):\n    return [x for inner in lists for x in inner]\n",
            lambda rng: ([_ints(rng, 0, 3) for _ in range(rng.randint(0, 4))],), (([],), ([[]],))),
    Problem("gcd", "gcd(a: int, b: int) -> int",
            "returns the greatest common divisor of the non-negative integers `a` and `b`, not "
            "both 0, without importing anything",
            "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
            lambda rng: (rng.randint(1, 300), rng.randint(0, 300)), ((0, 7), (12, 18))),
    Problem("fizzbuzz", "fizzbuzz(n: int) -> list[str]",
            "returns, for 1 to `n`, 'FizzBuzz' for multiples of 15, 'Fizz' for other multiples "
            "of 3, 'Buzz' for other multiples of 5, else the number as a string",
            "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
            "        out.append('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else "
            "'Buzz' if i % 5 == 0 else str(i))\n    return out\n",
            lambda rng: (rng.randint(1, 40),), ((0,), (15,))),
    Problem("second_largest", "second_largest(numbers: list[int]) -> int | None",
            "returns the second largest distinct value of `numbers`, or None when it has fewer "
            "than two distinct values",
            "def second_largest(numbers):\n    values = sorted(set(numbers))\n"
            "    return values[-2] if len(values) > 1 else None\n",
            lambda rng: (_ints(rng, 0, 8, 9),), (([],), ([3, 3],), ([5, 1],))),
    Problem("char_counts", "char_counts(text: str) -> dict[str, int]",
            "returns a dict from each character of `text` to how many times it occurs",
            "def char_counts(text):\n    counts = {}\n    for c in text:\n"
            "        counts[c] = counts.get(c, 0) + 1\n    return counts\n",
            lambda rng: (_words(rng, 0, 3),), (("",),)),
    Problem("chunk", "chunk(items: list[int], size: int) -> list[list[int]]",
            "returns `items` cut into consecutive lists of `size` items (the last may be "
            "shorter)",
            "def chunk(items, size):\n    return [items[i:i + size] for i in range(0, len(items), "
            "size)]\n",
            lambda rng: (_ints(rng, 0, 10), rng.randint(1, 4)), (([], 3),)),
    Problem("caesar", "caesar(text: str, shift: int) -> str",
            "returns `text` with each lowercase letter a-z moved `shift` places along the "
            "alphabet, wrapping around, and every other character unchanged",
            "def caesar(text, shift):\n    return ''.join(chr((ord(c) - 97 + shift) % 26 + 97) "
            "if 'a' <= c <= 'z' else c for c in text)\n",
            lambda rng: (_words(rng, 1, 3), rng.randint(-30, 30)), (("xyz", 3),)),
    Problem("digit_sum", "digit_sum(n: int) -> int",
            "returns the sum of the decimal digits of the non-negative integer `n`",
            "def digit_sum(n):\n    return sum(int(d) for d in str(n))\n",
            lambda rng: (rng.randint(0, 10**9),), ((0,),)),
    Problem("merge_sorted", "merge_sorted(a: list[int], b: list[int]) -> list[int]",
            "returns the items of the sorted lists `a` and `b` as one sorted list",
            "def merge_sorted(a, b):\n    return sorted(a + b)\n",
            lambda rng: (sorted(_ints(rng)), sorted(_ints(rng))), (([], []),)),
    Problem("title_case", "title_case(text: str) -> str",
            "returns `text` with each space-separated word's first character upper case and "
            "the rest lower case, the spaces kept as they are",
            "def title_case(text):\n    return ' '.join(w[:1].upper() + w[1:].lower() for w in "
            "text.split(' '))\n",
            lambda rng: (_words(rng),), (("",), ("a  b",))),
    Problem("rotate", "rotate(items: list[int], k: int) -> list[int]",
            "returns `items` rotated right by `k` places (k may exceed the length; an empty "
            "list stays empty)",
            "def rotate(items, k):\n    if not items:\n        return []\n    k %= len(items)\n"
            "    return items[-k:] + items[:-k] if k else list(items)\n",
            lambda rng: (_ints(rng), rng.randint(0, 12)), (([], 3), ([1, 2, 3], 3))),
    Problem("to_binary", "to_binary(n: int) -> str",
            "returns the binary digits of the non-negative integer `n`, without a prefix "
            "('0' for 0)",
            "def to_binary(n):\n    return bin(n)[2:]\n",
            lambda rng: (rng.randint(0, 5000),), ((0,), (1,))),
    Problem("word_lengths", "word_lengths(text: str) -> dict[str, int]",
            "returns a dict from each word of `text` (split on white space) to its length",
            "def word_lengths(text):\n    return {w: len(w) for w in text.split()}\n",
            lambda rng: (_words(rng),), (("",),)),
)
# Fixed, so that no seed moves a problem between splits.
HELD_OUT = frozenset(("is_palindrome", "second_largest", "caesar", "rotate"))

# Put before each problem's `check`: strict equality (module doc).
_SAME = '''def _same(got, want):
    if type(got) is not type(want):
        return False
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return _same(sorted(got.items(), key=repr), sorted(want.items(), key=repr))
    return got == want

'''


def reference(problem: Problem) -> Callable[..., Any]:
  """The problem's reference solution as a function (our own source, run here)."""
  namespace: dict[str, Any] = {}
  exec(problem.solution, namespace)  # pylint: disable=exec-used
  return namespace[problem.name]


def tests(problem: Problem, seed: int, count: int = 8) -> str:
  """`check(candidate)` over the edge cases and `count` drawn arguments (module doc)."""
  rng = random.Random(f"code/{problem.name}/{seed}")
  solve = reference(problem)
  cases = list(problem.edge_cases) + [problem.arguments(rng) for _ in range(count)]
  lines = [_SAME, "def check(candidate):"]
  for arguments in cases:
    call = ", ".join(repr(a) for a in arguments)
    expected = solve(*[_copy(a) for a in arguments])
    lines.append(f"    assert _same(candidate({call}), {expected!r}), "
                 f"{f'{problem.name}({call})'!r}")
  return "\n".join(lines) + "\n"


def _copy(value: Any) -> Any:
  """A deep copy of test arguments (lists of ints, lists of lists), so a solution that changes
  its argument cannot change the next case's."""
  return [_copy(v) for v in value] if isinstance(value, list) else value


def generate(split: str, seed: int = 0, tests_per_problem: int = 8) -> list[dict]:
  """The split's problems as prompt records (module doc), the same for the same arguments.

  Raises:
    ValueError: an unknown split, or `tests_per_problem` outside [0, MAX_TESTS_PER_PROBLEM].
  """
  if split not in SPLITS:
    raise ValueError(f"split={split!r}: valid splits: {', '.join(SPLITS)}")
  if not 0 <= tests_per_problem <= MAX_TESTS_PER_PROBLEM:
    raise ValueError(f"tests_per_problem={tests_per_problem}: give 0 to "
                     f"{MAX_TESTS_PER_PROBLEM} drawn test cases per problem")
  records = []
  for problem in PROBLEMS:
    if (problem.name in HELD_OUT) != (split == "held_out"):
      continue
    records.append({
        "id": f"code-{problem.name}",
        "prompt": (f"Write a Python function `{problem.signature}` that {problem.does}. Reply "
                   "with the function alone, in a ```python block."),
        "tests": tests(problem, seed, tests_per_problem), "entry_point": problem.name,
        "completion": f"```python\n{problem.solution}```"})
  return records
