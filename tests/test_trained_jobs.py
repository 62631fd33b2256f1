"""The shared trained-job cache (tests/trained_jobs.py): an entry is made once and served after,
longer command lists start from it, a change to the code it ran or to its command lines makes a
new one, an entry written into is made again, a failed command keeps nothing, and two processes
asking at once make it once.

Each test runs the cache on a copy of the source tree, so it can change the code, and on a cache
folder of its own. Training is the cheapest that leaves a job (one synthetic step); the tests of
the cache's own bookkeeping print a config instead, which imports the same code in seconds.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tests import trained_jobs

COMMANDS = [["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
             "--fdl.train.steps=1", "--job_log_dir=runs/one"]]
PRINT = [["--mode=print", "--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data"]]


@pytest.fixture(name="root")
def fixture_root(tmp_path):
  """A copy of the packages the commands run (plain files, even from Bazel's runfiles)."""
  root = tmp_path / "src"
  for package in trained_jobs.CODE_ROOTS:
    shutil.copytree(trained_jobs.source_root() / package, root / package, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
  return root


def _entries(cache):
  return sorted(p.name for p in (cache / "jobs").iterdir() if p.is_dir())


def _made(prepared):
  """When the entry was made (its record, not the file times a copy would change)."""
  return json.loads((prepared.workdir.parent / "entry.json").read_text())["made"]


@pytest.mark.slow
def test_served_once_made_and_made_again_when_the_code_or_command_changes(root, tmp_path):
  cache = tmp_path / "cache"
  first = trained_jobs.prepare(COMMANDS, root, cache)
  assert (first.workdir / "runs" / "one" / "checkpoints" / "1").is_dir()
  assert [r.code for r in first.results] == [0] and "done: step 1" in first.results[0].stdout

  again = trained_jobs.prepare(COMMANDS, root, cache)
  assert again == first and _made(again) == _made(first)  # Served, not run again.

  # Commands that extend these start from a copy of their entry: the training is not run
  # again (a second run would print other timings), only the command after it.
  longer = trained_jobs.prepare(COMMANDS + PRINT, root, cache)
  assert longer.workdir != first.workdir and longer.results[0] == first.results[0]
  assert "model.num_layers = 2" in longer.results[1].stdout
  assert (trained_jobs.tree_digest(longer.workdir / "runs" / "one")
          == trained_jobs.tree_digest(first.workdir / "runs" / "one"))
  assert len(_entries(cache)) == 2
  # And the first command of a list is kept on its own, for the lists that start with it.
  other_cache = tmp_path / "other_cache"
  two_prints = trained_jobs.prepare(PRINT + [["--mode=print", "--exp=PyCodeTiny"]], root,
                                    other_cache)
  assert len(_entries(other_cache)) == 2
  assert trained_jobs.prepare(PRINT, root, other_cache).results == two_prints.results[:1]

  # A module the training imported changes: a new entry, the old one kept (another checkout
  # may still be at the old code).
  steps = root / "lingvo_lite" / "training" / "steps.py"
  steps.write_text(steps.read_text() + "\n# Changed.\n")
  changed = trained_jobs.prepare(COMMANDS, root, cache)
  assert changed.workdir != first.workdir and len(_entries(cache)) == 3

  # A module it did not import is not part of the key.
  (root / "lingvo_lite" / "never_imported.py").write_text("x = 1\n")
  assert trained_jobs.prepare(COMMANDS, root, cache) == changed

  # Another command line: another entry.
  other = [[*COMMANDS[0], "--fdl.train.log_every_steps=1"]]
  assert trained_jobs.prepare(other, root, cache).workdir not in (first.workdir,
                                                                  changed.workdir)
  assert len(_entries(cache)) == 4


def test_an_entry_written_into_is_made_again_and_copies_are_the_tests_own(root, tmp_path):
  cache = tmp_path / "cache"
  first = trained_jobs.prepare(PRINT, root, cache)
  made = _made(first)
  assert "model.num_layers = 2" in first.results[0].stdout
  copy = trained_jobs.copy_workdir(first, tmp_path / "mine")
  (copy / "mine.txt").write_text("a test's own file")
  assert trained_jobs.prepare(PRINT, root, cache) == first  # The copy is not the entry.

  (first.workdir / "stray.txt").write_text("written into the cache")
  remade = trained_jobs.prepare(PRINT, root, cache)
  assert remade.workdir == first.workdir and _made(remade) > made
  assert not (remade.workdir / "stray.txt").exists()


def test_a_failed_command_keeps_nothing(root, tmp_path):
  cache = tmp_path / "cache"
  with pytest.raises(AssertionError, match=r"--fdl\.model\.num_layers=0: exit 2\n"
                     r".*must be a positive integer"):
    trained_jobs.prepare([[*PRINT[0], "--fdl.model.num_layers=0"]], root, cache)
  assert _entries(cache) == []


# Asks for the entry from a process of its own; prints the working directory it got.
_ASK = """
import json, pathlib, sys
from tests import trained_jobs
prepared = trained_jobs.prepare(json.loads(sys.argv[1]), pathlib.Path(sys.argv[2]),
                                pathlib.Path(sys.argv[3]))
print(prepared.workdir)
"""


def test_two_processes_asking_at_once_make_it_once(root, tmp_path):
  cache = tmp_path / "cache"
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(trained_jobs.source_root()),
                                                    env.get("PYTHONPATH")]))
  askers = [subprocess.Popen([sys.executable, "-c", _ASK, json.dumps(PRINT), str(root),
                              str(cache)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
  outputs = [asker.communicate(timeout=trained_jobs.TIMEOUT_S) for asker in askers]
  for asker, (_, stderr) in zip(askers, outputs):
    assert asker.returncode == 0, stderr[-3000:]
  workdirs = {stdout.strip() for stdout, _ in outputs}
  assert len(workdirs) == 1 and len(_entries(cache)) == 1
  # Neither left a half-made folder behind (they start with '.').
  assert not [p for p in (cache / "jobs").iterdir() if p.name.startswith(".")]
  assert pathlib.Path(workdirs.pop()).is_dir()
