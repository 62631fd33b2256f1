"""bin/lm_eval.py given a wrong command: each refusal is one line on stderr and exit 2 (no usage
block, no traceback), found before the model loads, and the job dir is left as it was.

The table calls lm_eval_cli.main in this process (one import of lm_eval and JAX for all of
it; lm_eval's index of its task files is built once per folder, not once per case, and its log
handler writes to the captured stderr); one case runs as a user runs it, `python
bin/lm_eval.py` from the repository root.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys

import pytest

from lingvo_lite.harness import lm_eval_cli
from tests.trained_jobs import tree_digest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINGVO = ["--model", "lingvo_lite"]
TINY = LINGVO + ["--model_args", "job_log_dir=runs/tiny"]
TASK = ["--tasks", "lingvo_lite_pycode_next"]
# A task whose data function returns no documents.
EMPTY_TASK = {
    "empty_data.py": "import datasets\n\ndef empty(**_):\n  return datasets.DatasetDict("
                     "{'test': datasets.Dataset.from_list([])})\n",
    "empty.yaml": "task: lk_empty\ncustom_dataset: !function empty_data.empty\n"
                  "output_type: loglikelihood\ntest_split: test\ndoc_to_text: '{{context}}'\n"
                  "doc_to_target: '{{continuation}}'\nmetric_list:\n  - metric: acc\n"
                  "    aggregation: mean\n    higher_is_better: true\n",
}


@pytest.fixture(scope="module")
def workdir(tiny_job):
  folder = tiny_job / "my_tasks"
  folder.mkdir()
  for name, text in EMPTY_TASK.items():
    (folder / name).write_text(text)
  # Files lm_eval would open by name and wait on, and a --config file that is a list.
  (tiny_job / "fifo_tasks").mkdir()
  for name in ("fifo.yaml", "fifo_tasks/a.yaml"):
    os.mkfifo(tiny_job / name)
  (tiny_job / "list.yaml").write_text("- limit\n- 1\n")
  return tiny_job


@pytest.fixture(scope="module", autouse=True)
def _one_task_index_per_folder():
  """lm_eval's TaskIndex.build, once per folder for the module, without lm_eval's own task
  folder: its ~14,000 task files take 20 s and more to index, and no case names one of them
  (each names a task of tasks/lm_eval or of its own folder, or one that no folder has: lm_eval's
  refusal of it reads the same). The same index of the other folders: folder by folder, later
  folders' entries over earlier ones'."""
  from lm_eval.tasks import _index  # pylint: disable=g-import-not-at-top
  build, built = _index.TaskIndex.build, {}
  builtin = os.path.dirname(os.path.abspath(_index.__file__))

  def build_once(paths, *, resolve_includes=True):
    index = {}
    for root in paths:
      key = (os.path.abspath(root), resolve_includes)
      if key[0] == builtin:
        continue
      if key not in built:
        built[key] = build([root], resolve_includes=resolve_includes)
      index.update(built[key])
    return index

  _index.TaskIndex.build = staticmethod(build_once)
  yield
  _index.TaskIndex.build = staticmethod(build)


def _run(args):
  """(exit code, stderr) of `bin/lm_eval.py ARGS` run in this process; lm_eval's log lines
  (its handler keeps the stderr of its first run) go to the same captured stderr."""
  stderr = io.StringIO()
  handlers = [h for h in logging.getLogger("lm_eval").handlers
              if type(h) is logging.StreamHandler]  # (pytest's capture handlers subclass it.)
  streams = [h.setStream(stderr) for h in handlers]
  code = 0
  try:
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
      lm_eval_cli.main(["lm_eval.py", *args])
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else 1
  finally:
    for handler, stream in zip(handlers, streams):
      handler.setStream(stream)
  return code, stderr.getvalue()


CASES = {
    # lm_eval's parser: one line, not its usage block.
    "limit not a number": (TINY + TASK + ["--limit", "abc"],
                           "lm_eval.py: error: argument --limit/-L: invalid float value: 'abc' "
                           "(--help lists the arguments)"),
    "unknown flag": (TINY + TASK + ["--bogus"], "unrecognized arguments: --bogus"),
    "model_args without =": (LINGVO + ["--model_args", "runs/tiny"] + TASK,
                             "argument --model_args: expected `key=value`, got 'runs/tiny'"),
    # What lm_eval would take and fail on mid-run.
    "limit 0": (TINY + TASK + ["--limit", "0"],
                "--limit=0: give a number of documents per task (an integer >= 1) or a "
                "fraction of each task's documents in (0, 1)"),
    "limit -1": (TINY + TASK + ["--limit", "-1"], "--limit=-1: give a number of documents"),
    "limit nan": (TINY + TASK + ["--limit", "nan"], "--limit=nan: give a number of documents"),
    "limit 2.5": (TINY + TASK + ["--limit", "2.5"], "--limit=2.5: give a number of documents"),
    "no tasks": (TINY, "--tasks: missing; give the tasks to evaluate"),
    "an empty task name": (TINY + ["--tasks", "lingvo_lite_pycode_next,,x"],
                           "--tasks='lingvo_lite_pycode_next,,x': an empty task name"),
    # lm_eval's own refusals.
    "unknown task": (TINY + ["--tasks", "lingvo_lite_pycode_nxt"],
                     "lm_eval.py: error: --tasks: lm_eval has no task named "
                     "lingvo_lite_pycode_nxt; `python bin/lm_eval.py ls tasks` lists them"),
    "a task without documents": (TINY + ["--tasks", "lk_empty", "--include_path", "my_tasks"],
                                 "--tasks lk_empty: the task's evaluation split holds no "
                                 "documents"),
    "log_samples without output_path": (TINY + TASK + ["--log_samples"],
                                        "lm_eval.py: error: Specify --output_path if providing "
                                        "--log_samples or --predict_only"),
    "a config file that is a list": (TINY + TASK + ["--config", "list.yaml"],
                                     "lm_eval.py: error: --config: YAML root must be a mapping"),
    # Files lm_eval opens by name: never waited on, never a traceback.
    "a missing config file": (TINY + TASK + ["--config", "nope.yaml"],
                              "--config=nope.yaml: no such file; give a YAML file"),
    "a config file that is a FIFO": (TINY + TASK + ["--config", "fifo.yaml"],
                                     "--config=fifo.yaml: is a FIFO (named pipe), not a regular "
                                     "file"),
    "a task file that is a FIFO": (TINY + ["--tasks", "fifo.yaml"],
                                   "--tasks fifo.yaml: is a FIFO (named pipe)"),
    "a task folder holding a FIFO": (TINY + ["--tasks", "fifo_tasks"],
                                     "--tasks fifo_tasks: fifo_tasks/a.yaml: is a FIFO"),
    "an include_path holding a FIFO": (TINY + TASK + ["--include_path", "fifo_tasks"],
                                       "--include_path=fifo_tasks: fifo_tasks/a.yaml: is a FIFO"),
    # --model_args of the lingvo_lite model.
    "checkpoint_step not a number": (
        LINGVO + ["--model_args", "job_log_dir=runs/tiny,checkpoint_step=abc"] + TASK,
        "--model_args checkpoint_step='abc': must be an integer >= 0"),
    "checkpoint_step not saved": (
        LINGVO + ["--model_args", "job_log_dir=runs/tiny,checkpoint_step=7"] + TASK,
        "--checkpoint_step=7: no such checkpoint in"),
    "empty model_args": (LINGVO + ["--model_args", ""] + TASK,
                         "--model_args='': empty; give job_log_dir=JOB"),
    "no model_args": (LINGVO + TASK, "--model_args: missing; give job_log_dir=JOB"),
    "no job_log_dir": (LINGVO + ["--model_args", "exp=PyCodeTiny"] + TASK,
                       "--model_args: job_log_dir is missing"),
    "a new job dir without exp": (LINGVO + ["--model_args", "job_log_dir=runs/new"] + TASK,
                                  "job_log_dir=runs/new: holds no config.json; give the job "
                                  "dir of a training run, or exp=NAME"),
    "an unknown experiment": (LINGVO + ["--model_args", "job_log_dir=runs/new,exp=Nope"] + TASK,
                              "--exp=Nope: no such experiment"),
    "job_log_dir a number": (LINGVO + ["--model_args", "job_log_dir=7"] + TASK,
                             "--model_args job_log_dir=7: is an int, not text; quote it"),
    "max_gen_toks 0": (LINGVO + ["--model_args", "job_log_dir=runs/tiny,max_gen_toks=0"] + TASK,
                       "--model_args max_gen_toks=0: must be an integer >= 1"),
    "max_length a bool": (LINGVO + ["--model_args", "job_log_dir=runs/tiny,max_length=true"]
                          + TASK, "--model_args max_length=True: must be an integer >= 1"),
    "an unknown argument": (LINGVO + ["--model_args", "job_log_dir=runs/tiny,slots=4"] + TASK,
                            "--model_args slots: not an argument of the lingvo_lite model"),
    "a config field's bad value": (
        LINGVO + ["--model_args", "job_log_dir=runs/tiny,decode.slots=abc"] + TASK,
        "--set decode.slots=abc: 'abc' is not a Python literal"),
}


@pytest.fixture
def alarm():
  """A case that would wait on a FIFO fails after a minute instead of hanging the run."""
  def hung(*_):
    raise TimeoutError("hung for 60 s")
  previous = signal.signal(signal.SIGALRM, hung)
  signal.alarm(60)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("name", CASES)
def test_a_wrong_command_is_one_line_and_exit_2(workdir, monkeypatch, alarm, name):
  args, expected = CASES[name]
  monkeypatch.chdir(workdir)
  before = tree_digest(workdir / "runs")
  code, stderr = _run(args)
  assert code == 2 and expected in stderr and len(stderr.splitlines()) == 1, stderr
  assert stderr.startswith("lm_eval.py: error: ")
  assert tree_digest(workdir / "runs") == before and not (workdir / "runs/new").exists()


def test_a_real_bug_keeps_its_traceback(workdir, monkeypatch):
  """Only lm_eval's named refusals become one line: a ValueError from deeper in its
  configuration step (here its task index) is not one of them."""
  from lm_eval.tasks import manager  # pylint: disable=g-import-not-at-top

  def broken(self, names):
    raise ValueError("a bug")

  monkeypatch.setattr(manager.TaskManager, "match_tasks", broken)
  monkeypatch.chdir(workdir)
  with pytest.raises(ValueError, match="a bug"):
    lm_eval_cli.run(["lm_eval.py"] + TINY + TASK)


def test_as_a_user_runs_it(workdir):
  """`python bin/lm_eval.py` from the repository root: a checkpoint step the job never saved,
  refused (after the model's arguments are checked as loading it would: the config built, the
  checkpoints listed) in one line on the process's stderr, before lm_eval indexes a task."""
  before = tree_digest(workdir / "runs")
  job = workdir / "runs/tiny"
  result = subprocess.run(
      [sys.executable, "bin/lm_eval.py", "--model", "lingvo_lite", "--model_args",
       f"job_log_dir={job},checkpoint_step=7", "--tasks", "lingvo_lite_pycode_next"],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.splitlines() == [
      f"lm_eval.py: error: --checkpoint_step=7: no such checkpoint in {job}/checkpoints; its "
      "steps: 10, 20"]
  assert tree_digest(workdir / "runs") == before
