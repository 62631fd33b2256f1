"""What the families' serve tests share: each tiny family's short training (once per machine and
code version: tests/trained_jobs.py), and one load of a job that serves, decodes offline and
scores with the lm-evaluation-harness."""

from __future__ import annotations

import math
import pathlib
from typing import Mapping

import pytest

from lingvo_lite.decode.requests import Request
from tests.serving.server_process import ThreadServer

# A prompt longer than the tiny families' window of 32 positions (a byte a token).
PROMPT, NEW_TOKENS = "import os\nimport sys\n\n\ndef main(argv):\n  ", 24


def train_commands(families: Mapping[str, str], *more: str) -> tuple[tuple[str, ...], ...]:
  """Each family's experiment trained 3 steps into runs/<name>, evaluated on one batch."""
  return tuple((f"--exp={experiment}", "--fdl.train.steps=3", "--fdl.checkpoint.every_steps=3",
                "--fdl.eval_data.num_batches=1", *more, f"--job_log_dir=runs/{name}")
               for name, experiment in families.items())


def trained_families(folder: str, families: Mapping[str, str], *more: str):
  """A module-scoped fixture `jobs`: a working directory of the module's own (named after
  `folder`) holding the families' jobs as `train_commands(families, *more)` leaves them."""
  commands = train_commands(families, *more)

  @pytest.fixture(scope="module")
  def jobs(tmp_path_factory, prepare_workdir) -> pathlib.Path:
    workdir = tmp_path_factory.mktemp(folder)
    prepare_workdir(commands, workdir)
    return workdir
  return jobs


def serve_decode_and_score(job: pathlib.Path, name: str, score: bool = True) -> None:
  """One load of the job (the harness's model): `--mode=serve`'s answer to a greedy request
  past the window is the generator's offline decode, and (`score`) the harness scores a task
  of lingvo_lite's on it (it only forwards to the scorer the server's model runs)."""
  lm_eval = pytest.importorskip("lm_eval")
  from lm_eval.tasks import TaskManager  # pylint: disable=g-import-not-at-top
  from lingvo_lite.harness import lm_eval_model  # pylint: disable=g-import-not-at-top
  harness = lm_eval_model.LingvoLiteLM(job_log_dir=str(job))
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
  if not score:
    return
  manager = TaskManager(include_path=lm_eval_model.TASK_FOLDER, include_defaults=False)
  task = "lingvo_lite_pycode_choice"
  results = lm_eval.simple_evaluate(model=harness, tasks=[task], task_manager=manager,
                                    bootstrap_iters=0, limit=3)["results"][task]
  scores = {k: v for k, v in results.items() if "," in k and "stderr" not in k}
  assert scores and all(math.isfinite(v) for v in scores.values()), scores
