"""Jobs written when `train.objective` was a name ('dpo', 'lm') and DPO's settings were
`train.dpo` (commit f1c02d6) load as the objective parts they named, resume, and rerun from
their config.json to the very numbers they logged.

tests/fixtures/README.md says how `tests/fixtures/jobs_before_objective_parts/` was made.
"""

import importlib
import json
import os
import shutil

import fiddle as fdl
import pytest
from etils import epath

from lingvo_lite.config import files as config_files, former_objectives, moved_modules
from lingvo_lite.testing import run_cli, source_root
from lingvo_lite.training.objectives.dpo import Dpo
from lingvo_lite.training.objectives.lm import LanguageModelling

FIXTURE = source_root() / "tests" / "fixtures" / "jobs_before_objective_parts"


@pytest.fixture(autouse=True)
def _in_workdir(tmp_path, monkeypatch):
  shutil.copytree(FIXTURE, tmp_path / "old")
  monkeypatch.chdir(tmp_path / "old")  # The DPO job's data paths are relative to it.


def _rows(path: str) -> dict[int, dict]:
  return {row["step"]: row for row in map(json.loads, open(path)) if "loss" in row}


def test_their_configs_read_as_the_objectives_they_named(capsys):
  data = json.loads((FIXTURE / "dpo" / "config.json").read_text())
  assert "lingvo_lite.training.dpo.DpoSettings -> lingvo_lite.training.objectives.dpo.Dpo" in (
      moved_modules.migrate(data))
  dpo = config_files.load(epath.Path("dpo/config.json"))
  objective = dpo.train.objective
  assert fdl.get_callable(objective) is Dpo and objective.__arguments__ == {
      "beta": 0.5, "label_smoothing": 0.1}
  assert "dpo" not in dpo.train.__arguments__
  assert fdl.build(dpo.train).objective == Dpo(beta=0.5, label_smoothing=0.1)
  # Each field keeps where it was set: DPO's settings' origins are the objective's fields'.
  text = config_files.to_text(dpo)
  assert "train.objective.beta = 0.5" in text and "lk51_fixtures.py:28" in text.split(
      "train.objective.beta = 0.5")[1].splitlines()[0]
  said = capsys.readouterr().err
  assert ("train.objective='dpo' and train.dpo -> train.objective=Dpo(beta=0.5, "
          "label_smoothing=0.1)") in said
  lm = config_files.load(epath.Path("lm/config.json"))
  assert fdl.get_callable(lm.train.objective) is LanguageModelling
  assert lm.train.z_loss == 1e-4


def test_every_renamed_class_resolves_in_one_step():
  """Each class a config.json may name by its old path is found at its new one."""
  for old, new in moved_modules.MOVED_NAMES.items():
    module, _, name = new.rpartition(".")
    assert new not in moved_modules.MOVED_NAMES and isinstance(
        getattr(importlib.import_module(module), name), type), (old, new)


def test_a_stray_dpo_setting_beside_the_next_token_loss_is_dropped():
  """`train.dpo` of a job that trained 'lm' was never read: read as the next-token loss."""
  cfg = config_files.load(epath.Path("dpo/config.json"))
  cfg.train.__arguments__["dpo"] = cfg.train.objective
  cfg.train.__arguments__["objective"] = "lm"
  assert former_objectives.upgrade(cfg) == [
      "train.objective='lm' and train.dpo -> train.objective=LanguageModelling()"]
  assert fdl.get_callable(cfg.train.objective) is LanguageModelling
  assert "dpo" not in cfg.train.__arguments__


def test_the_dpo_job_resumes_from_its_checkpoint():
  result = run_cli(["--job_log_dir=dpo", "--fdl.train.steps=6"])
  assert result.code == 0, result.stderr[-2000:]
  assert "written when train.objective was a name" in result.stderr
  assert sorted(os.listdir("dpo/checkpoints"), key=int)[-1] == "6"
  rows = _rows("dpo/metrics.jsonl")
  assert max(rows) == 6 and {"reward_margin", "pairs"} <= set(rows[6])
  assert max(_rows("dpo/eval_validation.jsonl")) == 6


@pytest.mark.parametrize("job", ["dpo", "lm"])
def test_a_rerun_of_its_config_logs_the_numbers_it_logged(job):
  """The same config, seed and data: every number it logged (train and eval) again, to float32
  round-off (bitwise on the machine that made it; XLA:CPU's vectorized reductions sum in
  another order on another CPU: tests/config/test_job_before_training_move.py's fixture
  reruns 1 ulp off on an AVX-512 EPYC)."""
  result = run_cli([f"--fdl_config_file={job}/config.json", f"--job_log_dir=rerun_{job}"])
  assert result.code == 0, result.stderr[-2000:]
  for name in ("metrics.jsonl", "eval_validation.jsonl"):
    old, new = _rows(f"{job}/{name}"), _rows(f"rerun_{job}/{name}")
    assert sorted(new) == sorted(old) == ([2, 4] if name == "metrics.jsonl" else [4])
    for step, row in old.items():
      for key, value in row.items():
        if not key.endswith("_s") and key not in ("steps_per_s", "tokens_per_s", "mfu",
                                                  "tflops_per_device", "seconds"):
          assert new[step][key] == pytest.approx(value, rel=1e-6, abs=1e-12), (name, step, key)
