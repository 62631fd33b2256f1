"""Old module paths still work: a job dir made before the move into packages, and old imports.

`tests/fixtures/job_before_house_move/` was written by the commit before the move (see
tests/fixtures/README.md); every program that reads a job dir runs on a copy of it here.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from lingvo_lite.config import moved_modules
from lingvo_lite.testing import run_cli, source_root

FIXTURE = source_root() / "tests" / "fixtures" / "job_before_house_move"
OLD_MODULES = {"lingvo_lite.checkpoints", "lingvo_lite.decode_settings", "lingvo_lite.optimizers",
               "lingvo_lite.watchdog"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A working directory holding a copy of the old job at `old`."""
  root = tmp_path_factory.mktemp("moved_modules")
  shutil.copytree(FIXTURE, root / "old")
  return root


@pytest.fixture(autouse=True)
def _in_workdir(workdir, monkeypatch):
  monkeypatch.chdir(workdir)


def test_the_fixture_names_modules_that_moved():
  """Guards the premise: the fixture's config.json names old paths that no longer exist as
  modules of their own."""
  text = (FIXTURE / "config.json").read_text()
  named = {m for m in OLD_MODULES if f'"module": "{m}"' in text}
  assert named == OLD_MODULES
  assert all(m in moved_modules.MOVED_MODULES for m in named)


def test_migrate_rewrites_every_old_module_and_says_which():
  data = json.loads((FIXTURE / "config.json").read_text())
  moved = moved_modules.migrate(data)
  assert moved == sorted(f"{m} -> {moved_modules.MOVED_MODULES[m]}" for m in OLD_MODULES)
  text = json.dumps(data)
  assert not any(f'"module": "{m}"' in text for m in OLD_MODULES)
  assert moved_modules.migrate(data) == []  # Migrated data is left as it is.


def test_eval_reads_the_old_job_and_says_it_migrated():
  result = run_cli(["--mode=eval", "--job_log_dir=old"])
  assert result.code == 0, result.stderr[-2000:]
  assert "written before its modules moved into packages" in result.stderr
  assert "lingvo_lite.decode_settings -> lingvo_lite.decode.settings" in result.stderr
  assert "checkpoint step 10" in result.stdout + result.stderr


def test_decode_reads_the_old_job():
  result = run_cli(["--mode=decode", "--job_log_dir=old", "--prompt=def f(", "--decode_out=-",
                    "--fdl.decode.max_new_tokens=4"])
  assert result.code == 0, result.stderr[-2000:]
  record = json.loads(result.stdout.strip().splitlines()[-1])
  assert record["checkpoint_step"] == 10 and len(record["completion_ids"]) <= 4


def test_train_resumes_the_old_job_from_its_checkpoint():
  # Its checksums are as code before they recorded their step wrote them: the step is checked
  # on the restored state's step counter alone.
  record = json.loads((FIXTURE / "checkpoints" / "10" / "lingvo_lite_checksums.json").read_text())
  assert "step" not in record and "default/_METADATA" in record
  shutil.copytree("old", "resumed")
  result = run_cli(["--job_log_dir=resumed", "--fdl.train.steps=12"])
  assert result.code == 0, result.stderr[-2000:]
  assert "resumed from step 10 in " in result.stdout
  assert sorted(os.listdir("resumed/checkpoints"), key=int)[-1] == "12"
  steps = [json.loads(line).get("step") for line in open("resumed/metrics.jsonl")]
  assert max(s for s in steps if s is not None) == 12


def test_report_and_compare_read_the_old_job():
  new = ["--exp=PyCodeTiny", "--fiddler=tiny", "--job_log_dir=new", "--fdl.train.steps=2",
         "--fdl.model.dim=32", "--fdl.model.num_layers=1"]
  assert run_cli(new).code == 0
  result = run_cli(["--mode=report", "--job_log_dir=old", "--compare=new"])
  assert result.code == 0, result.stderr[-2000:]
  page = re.sub(r"<[^>]+>", " ", open("old/report/compare.html").read())
  # Fiddle's diff of the two configs, the old one read through the migration.
  assert re.search(r"train\.steps\s+10\s+2\b", page), page[:3000]
  assert "fields differ" in page


def test_old_import_paths_resolve_to_the_new_modules():
  """Experiment modules written against the old layout keep importing, and get the one
  module (not a second copy with its own registry)."""
  code = ("import lingvo_lite.registry as old, lingvo_lite.config.registry as new;"
          "from lingvo_lite.decode_settings import DecodeSettings;"
          "from lingvo_lite.decode.settings import DecodeSettings as New;"
          "assert old is new and DecodeSettings is New; print('ok')")
  env = dict(os.environ, PYTHONPATH=str(source_root()))
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
  assert out.stdout.strip() == "ok", out.stderr[-2000:]
