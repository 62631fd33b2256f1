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

import math

import pytest

from lingvo_lite.decode.requests import Request
from tests.serving.server_process import ThreadServer

FAMILIES = {"gemma3": "PyCodeGemma3Tiny", "olmo3": "PyCodeOlmo3Tiny",
            "qwen3": "PyCodeQwen3Tiny"}
TRAIN = tuple((f"--exp={experiment}", "--fdl.train.steps=3", "--fdl.checkpoint.every_steps=3",
               "--fdl.eval_data.num_batches=1",
               f"--job_log_dir=runs/{name}") for name, experiment in FAMILIES.items())
# A prompt longer than the tiny families' window of 32 positions (a byte a token).
PROMPT, NEW_TOKENS = "import os\nimport sys\n\n\ndef main(argv):\n  ", 24


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, prepare_workdir):
  workdir = tmp_path_factory.mktemp("dense_families")
  prepare_workdir(TRAIN, workdir)
  return workdir


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_serve_and_lm_eval_run_on_each_family(jobs, name):
  """One load of the job (the harness's model) serves, decodes offline and scores."""
  lm_eval = pytest.importorskip("lm_eval")
  from lm_eval.tasks import TaskManager  # pylint: disable=g-import-not-at-top
  from lingvo_lite.harness import lm_eval_model  # pylint: disable=g-import-not-at-top
  harness = lm_eval_model.LingvoLiteLM(job_log_dir=str(jobs / "runs" / name))
  model = harness.model
  assert model.setup.model.family_name == name
  expected, = model.generator.generate([Request(source="offline", prompt=PROMPT,
                                                max_new_tokens=NEW_TOKENS, temperature=0.0)])
  assert len(expected.prompt_ids) > 32
  server = ThreadServer(model, name)
  try:
    answer = server.complete({"prompt": PROMPT, "max_tokens": NEW_TOKENS, "temperature": 0})
  finally:
    server.stop()
  assert answer["choices"][0]["text"] == expected.completion_text
  assert answer["usage"]["completion_tokens"] == len(expected.completion_ids) > 0

  manager = TaskManager(include_path=lm_eval_model.TASK_FOLDER, include_defaults=False)
  task = "lingvo_lite_pycode_choice"
  results = lm_eval.simple_evaluate(model=harness, tasks=[task], task_manager=manager,
                                    bootstrap_iters=0, limit=3)["results"][task]
  scores = {k: v for k, v in results.items() if "," in k and "stderr" not in k}
  assert scores and all(math.isfinite(v) for v in scores.values()), scores
