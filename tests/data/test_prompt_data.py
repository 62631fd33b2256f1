"""Prompt records for reinforcement learning (data/prompt_records.py, data/prompt_data.py): bad
records refused in one line or skipped and counted, a deterministic resumable order, the text
a policy continues; the generated sets
(tasks/arithmetic_problems.py, tasks/code_problems.py) deterministic by seed, their splits
disjoint, the arithmetic answers those of the problems' own words; bin/make_prompts.py."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lingvo_lite.data import prompt_data, prompt_records
from lingvo_lite.data.prompt_data import PromptData
from lingvo_lite.errors import DataError, UsageError
from tasks import arithmetic_problems, code_problems
from tests.bin_tools import tool

# Records the format accepts (the tests field is data here: nothing runs it).
GOOD = [
    {"id": "a", "prompt": "2 + 2?", "answer": 4},
    {"id": 2, "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}],
     "tests": ["assert True"], "entry_point": "f"},
    {"id": "c", "prompt": "Name a city.", "answer": "Paris", "completion": "Paris"},
]
# A bad line -> what its one line says after `<file>: line N: `.
BAD = {
    b'[1, 2]': "not a JSON object but a list",
    b'{"id": "x", "prompt": ': "not valid JSON",
    b'\xff{"id": 1}': "not valid UTF-8 (byte 0xff at offset 0)",
    b'{"prompt": "p"}': "has no field 'id'",
    b'{"id": true, "prompt": "p"}': "'id' True is not a non-empty string or an integer",
    b'{"id": " ", "prompt": "p"}': "'id' ' ' is not a non-empty string",
    b'{"id": "a", "prompt": "again"}': "'id' 'a' is also",
    b'{"id": 9}': "has neither a string 'prompt' nor a list of 'messages'",
    b'{"id": 9, "prompt": "p", "messages": []}': "has both 'prompt' and 'messages'",
    b'{"id": 9, "prompt": ["p"]}': "'prompt' holds a list, not a string",
    b'{"id": 9, "prompt": "  "}': "'prompt' is empty",
    b'{"id": 9, "messages": []}': "'messages' is not a non-empty list",
    b'{"id": 9, "messages": [{"role": "robot", "content": "x"}]}': "has role 'robot'",
    b'{"id": 9, "messages": [{"role": "user"}]}': "message 0 has no string 'content'",
    b'{"id": 9, "messages": [{"role": "user", "content": "q"}, {"role": "assistant", '
    b'"content": "a"}]}': "the last message's role is 'assistant', not 'user'",
    b'{"id": 9, "system": 3, "prompt": "p"}': "'system' holds a int, not a string",
    b'{"id": 9, "prompt": "\\ud800"}': "not valid Unicode",
    b'{"id": 9, "prompt": "p", "answer": NaN}': "holds NaN, which JSON does not allow",
    b'{"id": 9, "prompt": "p", "answer": [1]}': "'answer' holds a list, not a string or a number",
    b'{"id": 9, "prompt": "p", "answer": ""}': "'answer' is empty",
    b'{"id": 9, "prompt": "p", "tests": 5}': "'tests' is neither Python source nor a list",
    b'{"id": 9, "prompt": "p", "entry_point": "f()"}': "'entry_point' 'f()' is not a Python name",
    b'{"id": 9, "prompt": "p", "answer": 1' + b'0' * 5000 + b'}': "not readable JSON",
    b'[' * 100_000 + b']' * 100_000: "nested too deeply to read",
}


def _write(path, lines: list[bytes]) -> str:
  path.write_bytes(b"\n".join(lines) + b"\n")
  return str(path)


def _good_lines() -> list[bytes]:
  return [json.dumps(record).encode() for record in GOOD]


def test_each_bad_record_is_refused_in_one_line_or_skipped_and_counted(tmp_path, caplog):
  for index, (line, reason) in enumerate(BAD.items()):
    path = _write(tmp_path / f"bad{index}.jsonl", _good_lines() + [b"", line])
    with pytest.raises(DataError) as refused:
      PromptData(files=path, prompts_per_step=2).check()
    message = str(refused.value)
    assert message.startswith(f"{path}: line 5: ") and reason in message, (line[:60], message)
    assert "\n" not in message and len(message) < 400
    skipping = PromptData(files=path, prompts_per_step=2, skip_bad_records=True)
    skipping.check()
    assert skipping.records == tuple(GOOD) and skipping.loaded().skipped == 1
  assert "1 of 4 prompt records are bad and left out" in caplog.text


def test_required_fields_and_empty_or_missing_sets(tmp_path):
  path = _write(tmp_path / "p.jsonl", _good_lines())
  with pytest.raises(DataError, match=r"line 2: has no field 'answer', which the run's rewards"):
    PromptData(files=path, prompts_per_step=1, required_fields=("answer",)).check()
  with pytest.raises(UsageError, match=r"^files='nothing\*\.jsonl': matches no file"):
    PromptData(files="nothing*.jsonl", prompts_per_step=1).check()
  empty = _write(tmp_path / "empty.jsonl", [b"[1]"])
  with pytest.raises(UsageError, match=r"holds no usable prompt record \(1 bad\)"):
    PromptData(files=empty, prompts_per_step=1, skip_bad_records=True).check()
  for bad, message in (({"files": ""}, r"^files=''"), ({"files": [path, 3]}, r"^files=\("),
                       ({"prompts_per_step": 0}, r"^prompts_per_step=0: is not an integer"),
                       ({"prompts_per_step": True}, r"^prompts_per_step=True"),
                       ({"seed": -1}, r"^seed=-1")):
    with pytest.raises(UsageError, match=message):
      PromptData(**{"files": path, "prompts_per_step": 1, **bad})


def test_the_order_is_a_function_of_seed_and_position(tmp_path):
  records = [{"id": i, "prompt": f"p{i}"} for i in range(23)]
  first = _write(tmp_path / "a.jsonl", [json.dumps(r).encode() for r in records[:10]])
  _write(tmp_path / "b.jsonl", [json.dumps(r).encode() for r in records[10:]])
  del first
  data = PromptData(files=str(tmp_path / "*.jsonl"), prompts_per_step=4, seed=3)
  assert data.records == tuple(records)  # Files in sorted order, lines in order.
  again = PromptData(files=(str(tmp_path / "*.jsonl"),), prompts_per_step=4, seed=3)
  steps = [[r["id"] for r in data.step_records(step)] for step in range(12)]
  assert steps == [[r["id"] for r in again.step_records(step)] for step in range(12)]
  drawn = np.concatenate(steps)
  for epoch in range(2):  # Each epoch visits every record once.
    assert sorted(drawn[23 * epoch:23 * (epoch + 1)].tolist()) == list(range(23))
  assert drawn[:23].tolist() != list(range(23)) and drawn[:23].tolist() != drawn[23:46].tolist()
  # Resuming from a stored position gives the same prompts whatever the batch size now.
  position = data.position_after(5)
  assert [r["id"] for r in data.records_at(range(position, position + 6))] == \
      drawn[20:26].tolist()
  # Two processes' rows make the global batch.
  halves = data.step_records(7, 0, 2) + data.step_records(7, 1, 2)
  assert [r["id"] for r in halves] == steps[7]
  other = PromptData(files=str(tmp_path / "*.jsonl"), prompts_per_step=4, seed=4)
  assert [r["id"] for r in other.step_records(0)] != steps[0]
  plain = PromptData(files=str(tmp_path / "*.jsonl"), prompts_per_step=4, shuffle=False)
  assert [r["id"] for r in plain.step_records(6)] == [24 % 23, 25 % 23, 26 % 23, 27 % 23]
  assert data.fingerprint == other.fingerprint and len(data.fingerprint) == 16
  assert prompt_records.messages_of(GOOD[1]) == [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "hi"}]


def test_prompt_text_is_the_conversation_through_the_chat_template(tmp_path):
  import jinja2  # pylint: disable=g-import-not-at-top
  from lingvo_lite.data import pretrained_tokenizer  # pylint: disable=g-import-not-at-top
  from tests.data import chat_tokenizers  # pylint: disable=g-import-not-at-top
  files = pretrained_tokenizer.read(chat_tokenizers.byte_level_folder(tmp_path, "llama3"))
  for record in GOOD[:2]:
    expected = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(
        chat_tokenizers.LLAMA3_TEMPLATE).render(
            messages=prompt_records.messages_of(record), add_generation_prompt=True,
            bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    assert prompt_records.prompt_text(record, files) == expected
    assert expected.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
  assert prompt_records.prompt_text(GOOD[0]) == "2 + 2?"  # No template: the prompt as it is.
  with pytest.raises(prompt_records.RecordError, match="takes a tokenizer with a chat template"):
    prompt_records.prompt_text(GOOD[1])


# The problems' own words, read back with no code of the generator: each sentence's number
# and what it does to the quantity.
_SENTENCES = [
    (re.compile(r"^\w+ has (\d+) \w+\.$"), lambda q, n: n),
    (re.compile(r"^(?:He|She) finds (\d+) more \w+\.$"), lambda q, n: q + n),
    (re.compile(r"^(?:He|She) gives (\d+) \w+ to \w+\.$"), lambda q, n: q - n),
    (re.compile(r"^Then the number of \w+ \w+ has (doubles|triples)\.$"),
     lambda q, n: q * (2 if n == "doubles" else 3)),
]
_GROUPS = re.compile(r"^(?:He|She) buys (\d+) bags with (\d+) \w+ in each\.$")
_PILES = re.compile(r"^(?:He|She) splits the \w+ into (\d+) equal piles and keeps one pile\.$")


def _solve(prompt: str) -> tuple[int, tuple]:
  """(the answer, the arithmetic: each sentence's kind and numbers, names and items apart)."""
  story = prompt.split(" How many ")[0]
  quantity, arithmetic = None, []
  for sentence in re.split(r"(?<=\.) ", story):
    if match := _GROUPS.match(sentence):
      quantity += int(match.group(1)) * int(match.group(2))
      arithmetic.append(("groups", match.group(1), match.group(2)))
    elif match := _PILES.match(sentence):
      assert quantity % int(match.group(1)) == 0, sentence
      quantity //= int(match.group(1))
      arithmetic.append(("piles", match.group(1)))
    else:
      (index, pattern, step), = [(i, p, s) for i, (p, s) in enumerate(_SENTENCES)
                                 if p.match(sentence)]
      value = pattern.match(sentence).group(1)
      quantity = step(quantity, int(value) if value.isdigit() else value)
      arithmetic.append((index, value))
    assert 0 <= quantity, sentence
  return quantity, tuple(arithmetic)


def test_arithmetic_problems_are_deterministic_disjoint_and_right():
  train = arithmetic_problems.generate("train", 1500, seed=0)
  held_out = arithmetic_problems.generate("held_out", 300, seed=0)
  assert train == arithmetic_problems.generate("train", 1500, seed=0)
  assert train[:50] != arithmetic_problems.generate("train", 50, seed=1)
  other_seed = arithmetic_problems.generate("held_out", 300, seed=1)
  arithmetic = lambda records: {_solve(r["prompt"])[1] for r in records}
  assert not arithmetic(train) & (arithmetic(held_out) | arithmetic(other_seed))
  assert arithmetic(held_out) != arithmetic(other_seed)
  for records in (train, held_out):
    assert len(arithmetic(records)) == len(records)  # Each problem once.
    assert len({r["id"] for r in records}) == len(records)
    for record in records:
      prompt_records.checked_record(record, ("answer",))
      assert _solve(record["prompt"])[0] == record["answer"], record["prompt"]
      assert 2 <= record["steps"] <= 3
      assert record["completion"].endswith(f"<answer>{record['answer']}</answer>")
  # The difficulty knobs (the GRPO demo's easy set): steps, number size, kinds of operation;
  # one_shot adds the system string alone, the problems unchanged.
  easy = arithmetic_problems.generate("held_out", 200, seed=0, min_steps=1, max_steps=2,
                                      max_number=20, operations=("add", "take"), one_shot=True)
  plain = arithmetic_problems.generate("held_out", 200, seed=0, min_steps=1, max_steps=2,
                                       max_number=20, operations=("add", "take"))
  assert [{k: v for k, v in r.items() if k != "system"} for r in easy] == plain
  assert not arithmetic(easy) & arithmetic(arithmetic_problems.generate(
      "train", 500, seed=0, min_steps=1, max_steps=2, max_number=20, operations=("add", "take")))
  assert {r["steps"] for r in easy} == {1, 2}
  for record in easy:
    assert record["system"] == arithmetic_problems.ONE_SHOT_SYSTEM
    assert _solve(record["prompt"])[0] == record["answer"], record["prompt"]
    kinds = {step[0] for step in _solve(record["prompt"])[1]}
    assert kinds <= {0, 1, 2}, record["prompt"]  # Has, finds more, gives away: no other.
    assert max(int(n) for n in re.findall(r"\d+", record["prompt"])) <= 20


def test_code_problems_are_deterministic_with_a_fixed_held_out_set():
  train, held_out = code_problems.generate("train"), code_problems.generate("held_out")
  assert train == code_problems.generate("train")
  assert code_problems.generate("train", seed=1) != train
  assert {r["id"] for r in held_out} == {f"code-{name}" for name in code_problems.HELD_OUT}
  assert not {r["id"] for r in train} & {r["id"] for r in held_out}
  assert len(train) + len(held_out) == len(code_problems.PROBLEMS)
  for record in train + held_out:
    prompt_records.checked_record(record, ("tests",))


def test_make_prompts_writes_and_checks_sets(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  make_prompts = tool("make_prompts")
  assert make_prompts.main(["--task=arithmetic", "--split=held_out", "--count=30",
                            "--out=sets/held_out.jsonl"]) == 0
  written = [json.loads(line) for line in open("sets/held_out.jsonl")]
  assert written == arithmetic_problems.generate("held_out", 30, seed=0)
  assert make_prompts.main(["--task=code", "--out=sets/code.jsonl"]) == 0
  assert make_prompts.main(["--task=arithmetic", "--count=5", "--form=chat",
                            "--out=chat/sft.jsonl"]) == 0
  from lingvo_lite.data import chat_template  # pylint: disable=g-import-not-at-top
  for line, problem in zip(open("chat/sft.jsonl"), arithmetic_problems.generate("train", 5)):
    messages = chat_template.checked_messages(json.loads(line)["messages"])
    assert messages == [{"role": "user", "content": problem["prompt"]},
                        {"role": "assistant", "content": problem["completion"]}]
  assert make_prompts.main(["--task=code", "--out=sets/code.jsonl"]) == 0  # The same set: kept.
  assert capsys.readouterr().out.endswith("kept sets/code.jsonl (up to date): 14 code prompt "
                                          "records (train, seed 0)\n")
  (tmp_path / "mine.jsonl").write_text("the user's own\n")
  assert make_prompts.main(["--check=sets/*.jsonl", "--rewards=code_tests"]) == 1
  assert capsys.readouterr().err == ("make_prompts: sets/held_out.jsonl: line 1: has no field "
                                     "'tests', which the run's rewards read\n")
  assert make_prompts.main(["--check=sets/held_out.jsonl",
                            "--rewards=exact_answer,answer_format"]) == 0
  assert capsys.readouterr().out.startswith("30 prompt records, fingerprint ")
  for argv, message in (
      (["--task=arithmetic"], "--out: required with --task"),
      (["--task=arithmetic", "--out=x.jsonl", "--count=0"], "--count=0: must be at least 1"),
      (["--task=arithmetic", "--out=x.jsonl", "--min_steps=4"], "min_steps=4, max_steps=3"),
      (["--task=arithmetic", "--out=x.jsonl", "--operations=add,divide"],
       "operations=('add', 'divide'): give one or more of add, take, groups, times, share"),
      (["--check=sets/code.jsonl", "--rewards=exact_answr"], "did you mean exact_answer?"),
      (["--task=sudoku", "--out=x.jsonl"], "invalid choice: 'sudoku'"),
      (["--task=code", "--seed=1", "--out=sets/code.jsonl"], "holds something else"),
      (["--task=code", "--out=mine.jsonl"], "holds something else"),
      (["--task=code", "--out=sets"], "not a regular file")):
    assert make_prompts.main(argv) == 2, argv
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, (argv, err)
  assert (tmp_path / "mine.jsonl").read_text() == "the user's own\n"
  assert sorted(p.name for p in (tmp_path / "sets").iterdir()) == ["code.jsonl", "held_out.jsonl"]
  assert [p.name for p in (tmp_path / "chat").iterdir()] == ["sft.jsonl"]
