"""Serve and score today's dense families: PyCodeQwen3Tiny, PyCodeGemma3Tiny and PyCodeOlmo3Tiny
each train 3 steps on the stdlib data and evaluate one batch (once per machine and code version: the shared
trained-job cache, tests/trained_jobs.py), then

- `--mode=serve`'s app and engine (in a thread of this process, over the loaded model a serve
  process builds: tests/serving/test_server.py runs the real process) answer OpenAI
  completions, greedy and past the sliding window, with the text the decode program's
  generator gives offline;
- the lm-evaluation-harness scores a lingvo_lite task on each job with the `lingvo_lite`
  model (the same loaded model: one load and compile serves, decodes and scores).
"""

import pytest

from tests.serving.family_serving import serve_decode_and_score, trained_families

FAMILIES = {"gemma3": "PyCodeGemma3Tiny", "olmo3": "PyCodeOlmo3Tiny",
            "qwen3": "PyCodeQwen3Tiny"}
jobs = trained_families("dense_families", FAMILIES)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_serve_and_lm_eval_run_on_each_family(jobs, name):
  """One load of the job (the harness's model) serves, decodes offline and scores."""
  serve_decode_and_score(jobs / "runs" / name, name)
