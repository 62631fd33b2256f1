"""A job dir written before the training package and the weight/data format tables (commit
2f4d3dc: its config.json names `lingvo_lite.optimizers.AdamW`) resumes, and reruns from its
config.json to the very numbers it logged.

tests/fixtures/README.md says how `tests/fixtures/job_before_training_move/` was made.
"""

import json
import os
import shutil

import pytest

from lingvo_lite.config import moved_modules
from lingvo_lite.testing import run_cli, source_root

FIXTURE = source_root() / "tests" / "fixtures" / "job_before_training_move"


@pytest.fixture(autouse=True)
def _in_workdir(tmp_path, monkeypatch):
  shutil.copytree(FIXTURE, tmp_path / "old")
  monkeypatch.chdir(tmp_path)


def _rows(path: str) -> dict[int, dict]:
  return {row["step"]: row for row in map(json.loads, open(path)) if "loss" in row}


def test_its_config_names_modules_that_moved_and_each_resolves():
  data = json.loads((FIXTURE / "config.json").read_text())
  moved = moved_modules.migrate(data)
  assert "lingvo_lite.optimizers -> lingvo_lite.training.optimizers" in moved
  assert moved_modules.migrate(data) == []  # Every old path was rewritten.


def test_train_resumes_it_from_its_checkpoint():
  result = run_cli(["--job_log_dir=old", "--fdl.train.steps=12"])
  assert result.code == 0, result.stderr[-2000:]
  assert "lingvo_lite.optimizers -> lingvo_lite.training.optimizers" in result.stderr
  assert sorted(os.listdir("old/checkpoints"), key=int)[-1] == "12"
  assert max(_rows("old/metrics.jsonl")) == 12


# The command tests/fixtures/README.md gives for the fixture, as this code runs it.
_FIXTURE_COMMAND = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fdl.train.steps=10",
                    "--fdl.checkpoint.every_steps=10", "--fdl.train.eval_every_steps=10",
                    "--fdl.model.dim=32", "--fdl.model.num_layers=1"]


def test_a_rerun_of_its_config_logs_the_numbers_it_logged():
  """The same config, seed and data: every loss the command that made it logs today, exactly
  (the old config.json migrates to the very setup), and the losses it logged itself to float32
  round-off: XLA:CPU's vectorized reductions sum in another order on another CPU (an
  AVX-512 EPYC's rerun is 1 ulp off at step 5), so bitwise holds on one machine only."""
  result = run_cli(["--fdl_config_file=old/config.json", "--job_log_dir=rerun"])
  assert result.code == 0, result.stderr[-2000:]
  result = run_cli([*_FIXTURE_COMMAND, "--job_log_dir=today"])
  assert result.code == 0, result.stderr[-2000:]
  for name in ("metrics.jsonl", "eval_validation.jsonl"):
    old, new, today = _rows(f"old/{name}"), _rows(f"rerun/{name}"), _rows(f"today/{name}")
    assert sorted(new) == sorted(old) == ([5, 10] if name == "metrics.jsonl" else [10])
    for step, row in old.items():
      assert new[step]["loss"] == today[step]["loss"], (name, step)
      assert new[step]["loss"] == pytest.approx(row["loss"], rel=1e-6, abs=0), (name, step)


def test_every_moved_module_resolves_in_one_step():
  """Each old path names a module that exists now (never another old path), so a config.json
  of any age migrates at once."""
  import importlib  # pylint: disable=import-outside-toplevel
  for old, new in moved_modules.MOVED_MODULES.items():
    assert new not in moved_modules.MOVED_MODULES, (old, new)
    importlib.import_module(new)
