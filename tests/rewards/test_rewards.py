"""The reward registry (names, refusals, weights, the failure policy) and the exact-answer and
format rewards on tables of cases; the code reward is tests/rewards/test_sandbox.py's."""

from __future__ import annotations

import math
import signal
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from lingvo_lite.errors import UsageError
from lingvo_lite.rewards import code_tests, registry
from lingvo_lite.rewards.answer_format import answer_format
from lingvo_lite.rewards.exact_answer import exact_answer
from tasks import code_problems

RECORD = {"id": "p-7", "prompt": "2 + 40?", "answer": 42}


# Test rewards, registered once for the module (the registry is the process's).
@registry.register("tests.value_field", fields=("value",))
def _value_field(record, completion):
  del completion
  return record["value"]


@registry.register("tests.length")
def _length(record, completion):
  del record
  return len(completion) / 10


def test_the_built_ins_are_registered_and_an_unknown_name_is_refused_with_the_choices():
  assert {"exact_answer", "answer_format", "code_tests"} <= set(registry.names())
  assert registry.get("exact_answer") is exact_answer
  with pytest.raises(UsageError) as refused:
    registry.get("exact_answr", "train.objective.rewards[0]")
  message = str(refused.value)
  assert message.startswith("train.objective.rewards[0]='exact_answr': no reward function")
  assert "did you mean exact_answer?" in message and "\n" not in message
  assert "valid choices: " + ", ".join(registry.names()) in message


@pytest.mark.parametrize("specs, names", [
    ([], "rewards=[]"),
    ("exact_answer", "rewards='exact_answer'"),
    ([("exact_answer",)], "rewards[0]=('exact_answer',)"),
    ([("nope", 1.0)], "rewards[0]='nope'"),
    ([("exact_answer", float("nan"))], "rewards[0]=('exact_answer', nan)"),
    ([("exact_answer", True)], "rewards[0]=('exact_answer', True)"),
    ([("exact_answer", "1")], "rewards[0]=('exact_answer', '1')"),
    ([("exact_answer", 1.0), ("exact_answer", 2.0)], "rewards[1]=('exact_answer', 2.0)"),
])
def test_bad_specs_are_refused_naming_the_field(specs, names):
  with pytest.raises(UsageError, match=r"^" + __import__("re").escape(names)):
    registry.check(specs)


def test_weights_combine_as_a_weighted_sum():
  specs = [("tests.value_field", 0.5), ("tests.length", -2.0), ("exact_answer", 3.0)]
  registry.check(specs)
  rng = np.random.default_rng(0)
  for _ in range(20):
    value = float(rng.uniform(-5, 5))
    completion = "x" * int(rng.integers(0, 30)) + rng.choice(["<answer>42</answer>", ""])
    scored = registry.score(specs, {**RECORD, "value": value}, completion)
    values = np.array([value, len(completion) / 10, float(completion.endswith("</answer>"))])
    assert scored.per_function == dict(zip([n for n, _ in specs], values.tolist()))
    assert scored.total == pytest.approx(float(np.dot([0.5, -2.0, 3.0], values)), rel=1e-12)
    assert not scored.failures
  assert registry.required_fields(specs) == ("value", "answer")


def test_a_second_function_under_one_name_is_refused():
  with pytest.raises(ValueError, match="registered twice"):
    registry.register("tests.length")(lambda record, completion: 0.0)


def test_a_dotted_name_imports_the_module_that_registers_it(tmp_path, monkeypatch):
  (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
      from lingvo_lite.rewards.registry import register

      @register("my_rewards.brevity")
      def brevity(record, completion):
          return 1.0 / (1 + len(completion))
      """))
  (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('no')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  assert registry.score([("my_rewards.brevity", 2.0)], RECORD, "abc").total == 0.5
  with pytest.raises(UsageError, match=r"importing module broken_rewards failed: RuntimeError"):
    registry.get("broken_rewards.thing")
  sys.modules.pop("my_rewards", None)


@pytest.mark.parametrize("completion, answer, expected", [
    ("so <answer>42</answer>", 42, 1.0),
    ("<answer> 42.0 </answer>", "42", 1.0),
    ("<answer>+42</answer>", 42, 1.0),
    ("<answer>84/2</answer>", 42, 1.0),
    ("<answer>42.</answer>", 42, 1.0),
    ("<answer>$1,234</answer>", 1234, 1.0),
    ("<answer>1e3</answer>", "1000", 1.0),
    ("<answer>0.1</answer>", 0.1, 1.0),
    ("<answer>0.30000000000000004</answer>", 0.3, 0.0),  # Exact: a different number.
    ("<answer>-3</answer>", -3, 1.0),
    ("<answer>41</answer>", 42, 0.0),
    ("42", 42, 0.0),  # No tag.
    ("<answer>1</answer> no: <answer>42</answer>", 42, 1.0),  # The last one counts.
    ("<answer>42</answer> no: <answer>1</answer>", 42, 0.0),
    ("<answer>New  York</answer>", "new york", 1.0),
    ("<answer>Paris</answer>", "London", 0.0),
    ("<answer>1,23</answer>", 123, 0.0),  # Not a thousands separator: text, not 123.
    ("<answer>4/0</answer>", 4, 0.0),
    ("<answer>1e999999999</answer>", 1, 0.0),  # Read as text, never computed.
    ("<answer></answer>", 0, 0.0),
    ("</answer>42<answer>", 42, 0.0),
    ("<answer>42", 42, 0.0),
])
def test_exact_answer(completion, answer, expected):
  assert exact_answer({**RECORD, "answer": answer}, completion) == expected


@pytest.mark.parametrize("completion, expected", [
    ("12 + 30 = 42\n<answer>42</answer>", 1.0),
    ("<answer>42</answer>\n  ", 1.0),
    ("<answer>42</answer> and more", 0.0),
    ("<answer>  </answer>", 0.0),
    ("<answer>1</answer><answer>2</answer>", 0.0),
    ("</answer>42<answer>", 0.0),
    ("42", 0.0),
    ("<answer>42", 0.0),
])
def test_answer_format(completion, expected):
  assert answer_format(RECORD, completion) == expected


def test_answer_rewards_take_linear_time_on_hostile_text():
  hostile = "<answer>" * 200_000 + "9" * 100_000
  start = time.monotonic()
  assert exact_answer(RECORD, hostile) == 0.0 and answer_format(RECORD, hostile) == 0.0
  assert time.monotonic() - start < 1.0


def _raises(record, completion):
  raise ValueError("boom")


def _exits(record, completion):
  raise SystemExit(3)


def _swallows_and_loops(record, completion):
  while True:
    try:
      while True:
        pass
    except Exception:  # pylint: disable=broad-except
      pass


FAILING = {
    "tests.raises": (_raises, "raised ValueError: boom"),
    "tests.exits": (_exits, "raised SystemExit: 3"),
    "tests.nan": (lambda r, c: float("nan"), "returned nan, not a finite number"),
    "tests.inf": (lambda r, c: -math.inf, "returned -inf, not a finite number"),
    "tests.none": (lambda r, c: None, "returned None, not a number"),
    "tests.text": (lambda r, c: "1", "returned '1', not a number"),
    "tests.complex": (lambda r, c: 1j, "returned 1j, not a number"),
    "tests.array": (lambda r, c: np.array([1.0, 2.0]), "returned array([1., 2.]), not a real"),
    "tests.loops": (_swallows_and_loops, "ran past its 0.2 s limit"),
}
for _name, (_fn, _) in FAILING.items():
  registry.register(_name, limit_s=0.2)(_fn)


def test_a_failing_reward_scores_0_with_a_counted_failure_naming_it_and_the_prompt():
  handler = signal.getsignal(signal.SIGALRM)
  specs = [(name, 1.0) for name in FAILING] + [("exact_answer", 2.0)]
  start = time.monotonic()
  scored = registry.score(specs, RECORD, "<answer>42</answer>")
  assert time.monotonic() - start < 2.0
  assert scored.total == 2.0 and math.isfinite(scored.total)
  assert scored.per_function == {**{name: 0.0 for name in FAILING}, "exact_answer": 1.0}
  assert len(scored.failures) == len(FAILING)
  for line, (name, (_, why)) in zip(scored.failures, FAILING.items()):
    assert line.startswith(f"reward {name} on prompt 'p-7': {why}") and "\n" not in line
  # The handler is the caller's again, and no watcher thread is left.
  assert signal.getsignal(signal.SIGALRM) is handler
  assert not [t for t in threading.enumerate() if t.name == "reward-limit"]
  warning = registry.failure_warning([scored, scored])
  assert warning.startswith(f"{2 * len(FAILING)} reward call(s) of 2 completion(s) failed")


def test_off_the_main_thread_a_slow_reward_scores_0_once_it_returns():
  registry.register("tests.slow", limit_s=0.05)(lambda r, c: time.sleep(0.2) or 1.0)
  found = []
  thread = threading.Thread(target=lambda: found.append(
      registry.score([("tests.slow", 1.0)], RECORD, "")))
  thread.start()
  thread.join()
  assert found[0].total == 0.0 and "past its 0.05 s limit" in found[0].failures[0]


def test_ctrl_c_in_a_reward_still_stops_the_run():
  def interrupted(record, completion):
    raise KeyboardInterrupt
  registry.register("tests.interrupted")(interrupted)
  with pytest.raises(KeyboardInterrupt):
    registry.score([("tests.interrupted", 1.0)], RECORD, "")


@pytest.mark.parametrize("completion, code", [
    ("Here:\n```js\nx()\n```\nand\n```python\ndef f():\n    pass\n```\n", "def f():\n    pass\n"),
    ("```\nA = 1\n```", "A = 1\n"),
    ("```Python  extra words\nA = 1\n```", "A = 1\n"),
    ("```python\nA = 1\n", "A = 1\n"),  # Left open: to the end.
    ("def f():\n    return 1\n", "def f():\n    return 1\n"),  # No fence: all of it.
    ("```python", "```python"),  # No line after the fence: no block.
])
def test_the_code_of_a_completion(completion, code):
  assert code_tests.completion_code(completion) == code


def test_finding_code_takes_linear_time_on_hostile_text():
  start = time.monotonic()
  code_tests.completion_code("```\n" * 50_000 + "x" * 200_000)
  code_tests.completion_code("``` " * 50_000)
  assert time.monotonic() - start < 1.0


def test_a_weighted_sum_that_overflows_scores_0_as_a_failure():
  scored = registry.score([("tests.value_field", 1e308), ("tests.length", 1e308)],
                          {**RECORD, "value": 10.0}, "x" * 100)
  assert scored.total == 0.0 and "overflows" in scored.failures[0]


def test_real_numbers_of_numpy_and_bools_are_values():
  cases = ((np.float32(0.5), 0.5), (np.array(2.0), 2.0), (True, 1.0), (np.int64(3), 3.0),
           (False, 0.0))
  for index, (value, expected) in enumerate(cases):
    registry.register(f"tests.value_{index}")(lambda r, c, value=value: value)
    scored = registry.score([(f"tests.value_{index}", 1.0)], RECORD, "")
    assert (scored.total, scored.failures) == (expected, []), value


def test_the_callers_own_alarm_reaches_its_handler_during_a_reward():
  """The limit is a signal to the main thread alone; another's SIGALRM (a process timer set by
  the caller) still reaches the caller's handler while a reward runs."""
  received = []
  previous = signal.signal(signal.SIGALRM, lambda signum, frame: received.append(signum))
  try:
    registry.register("tests.waits", limit_s=2.0)(lambda r, c: time.sleep(0.3) or 1.0)
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    scored = registry.score([("tests.waits", 1.0)], RECORD, "")
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
  assert (scored.total, scored.failures, received) == (1.0, [], [signal.SIGALRM])


def test_score_many_equals_score_one_by_one_with_the_code_reward_on_threads():
  records = code_problems.generate("held_out") * 2
  completions = [r["completion"] if i % 2 else "```python\ndef f():\n    pass\n```"
                 for i, r in enumerate(records)]
  specs = [("code_tests", 1.0), ("tests.length", 0.01), ("tests.raises", 1.0)]
  many = registry.score_many(specs, records, completions, workers=4)
  assert many == [registry.score(specs, r, c) for r, c in zip(records, completions)]
  assert [s.per_function["code_tests"] for s in many] == [float(i % 2) for i in range(8)]
  with pytest.raises(ValueError, match="2 records for 1 completions"):
    registry.score_many(specs, records[:2], completions[:1])
