"""bin/lm_eval.py's command line: lm-evaluation-harness's own CLI with the `lingvo_lite` model
registered, held to the house's contract (one line on stderr and exit 2 for a wrong command).

lm_eval's CLI prints its usage block before an argument error and lets its own refusals and a
task without documents end in tracebacks. Here, in order:

  1. every parser's error is the one line `lm_eval.py: error: MESSAGE` (no usage block);
  2. what can be checked before lm_eval starts is: `--limit` (a count >= 1 or a fraction in
     (0, 1); lm_eval takes 0 or -1 and fails mid-run), empty task names, the files lm_eval
     opens by name (`--config`, a `--tasks` YAML file or folder, every YAML file under
     `--include_path`: none may be a FIFO or a device, which lm_eval would wait on for ever;
     a missing `--config` is named), and, for `--model lingvo_lite`, `--model_args` (types,
     required arguments, bounds, then the job dir, experiment, weights, checkpoint step and
     config fields, as loading the model would check them, without loading it);
  3. while lm_eval runs, its named, expected refusals become that one line: the ValueErrors its
     configuration step raises itself (`Tasks not found: X`, `Need to specify task to
     evaluate.`, ..., and a `--config` file whose YAML is not a mapping), and a task whose
     evaluation split holds no documents. The tasks are built
     as soon as their names are resolved, before the model loads, so such a task is refused
     before any device time (lm_eval's own order loads the model first); the run then uses
     those same task objects (building a task draws nothing from the seeded generators but a
     nameless task's random id). Any other exception keeps its traceback: it is a bug.

Also: tasks/lm_eval (lingvo_lite's offline tasks) is added to `--include_path` when none is
given; `--use_cache PATH` keys lm_eval's request cache by the weights' checksum too (lm_eval
keys it by the request only, and would answer from another model's cache after a fine-tune);
lm_eval's advice to task authors that a data function could take `--metadata` (two lines for
each such task, as all of tasks/lm_eval are) is left out.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import logging
import math
import os
import pathlib
import sys
import traceback
from typing import Any, Iterator, Sequence

from lingvo_lite import input_files
from lingvo_lite.errors import UsageError, one_line, shown
from lingvo_lite.harness import lm_eval_model

PROGRAM = "lm_eval.py"
# lm_eval's own messages, made to name the argument (api/task.py, config/evaluate_config.py).
_NO_DOCUMENTS = "task.build_requests() did not find any docs!"
_NOT_FOUND = "Tasks not found: "
_NO_TASKS = "Need to specify task to evaluate."
_NOT_A_MAPPING = "YAML root must be a mapping"  # A --config file's (a TypeError).
_LISTED = "`python bin/lm_eval.py ls tasks` lists them"


def main(argv: Sequence[str]) -> None:
  """Runs lm_eval's command line `argv` (argv[0] the program).

  Raises:
    SystemExit: 2 with one line on stderr for a wrong command; lm_eval's own exits.
  """
  try:
    run(argv)
  except UsageError as e:
    print(f"{PROGRAM}: error: {one_line(str(e))}", file=sys.stderr)
    sys.exit(2)


def run(argv: Sequence[str]) -> None:
  """`main` without the exit: UsageError for a wrong command."""
  from lm_eval._cli import HarnessCLI  # pylint: disable=g-import-not-at-top
  from lm_eval.utils import setup_logging  # pylint: disable=g-import-not-at-top
  argv = list(argv)
  if not any(arg == "--include_path" or arg.startswith("--include_path=") for arg in argv):
    argv += ["--include_path", lm_eval_model.TASK_FOLDER]
  setup_logging()
  cli = HarnessCLI()
  for parser in _parsers(cli):
    parser.error = _refuse  # Instead of the usage block and the error: one line.
  saved = sys.argv
  sys.argv = argv  # HarnessCLI reads sys.argv (inserting `run` for the legacy form).
  try:
    args = cli.parse_args()
  finally:
    sys.argv = saved
  if getattr(args, "command", None) == "run":
    check_run_arguments(args)
  with _expected_errors_as_usage_errors(), _cache_keyed_by_weights(), \
      _without_metadata_advice():
    cli.execute(args)


def _parsers(cli: Any) -> list[argparse.ArgumentParser]:
  # HarnessCLI keeps its parser and subparsers private; these are the same objects its
  # parse_args uses.
  return [cli._parser, *cli._subparsers.choices.values()]  # pylint: disable=protected-access


def _refuse(message: str) -> None:
  raise UsageError(f"{message} (--help lists the arguments)")


def check_run_arguments(args: argparse.Namespace) -> None:
  """What `run` can check before lm_eval starts (see the module doc).

  Raises:
    UsageError: one line naming the argument.
  """
  limit = args.limit
  if limit is not None and (not math.isfinite(limit) or limit <= 0
                            or (limit > 1 and limit != int(limit))):
    raise UsageError(f"--limit={limit:g}: give a number of documents per task (an integer "
                     ">= 1) or a fraction of each task's documents in (0, 1)")
  if args.tasks is None and args.config is None:  # (A --config file may name them.)
    raise UsageError(f"--tasks: missing; give the tasks to evaluate ({_LISTED})")
  names = [name for task in args.tasks or () for name in task.split(",")]
  if any(not name.strip() for name in names):
    raise UsageError(f"--tasks={shown(','.join(args.tasks))}: an empty task name; give names "
                     f"separated by commas ({_LISTED})")
  _check_files(args.config, names, args.include_path)
  if args.model == "lingvo_lite" and (args.model_args is not None or args.config is None):
    lm_eval_model.model_arguments(args.model_args).check_job()


def _check_files(config: str | None, names: Sequence[str], include_path: str | None) -> None:
  """Refuses a file lm_eval would open by name and wait on (a FIFO, a device), and a missing
  `--config` (lm_eval's own refusal of one is a traceback)."""
  if config is not None:
    input_files.check(config, f"--config={config}", "give a YAML file of run settings")
    if not os.path.isfile(config):
      problem = "is a folder" if os.path.isdir(config) else "no such file"
      raise UsageError(f"--config={config}: {problem}; give a YAML file of run settings")
  fix = "give YAML files of tasks"
  for name in names:
    # lm_eval reads a name ending .yaml as a glob of task files, and a folder's *.yaml.
    found = (glob.glob(name) if name.endswith(".yaml") else
             glob.glob(os.path.join(glob.escape(name), "*.yaml")) if os.path.isdir(name) else ())
    for path in found:
      input_files.check(path, f"--tasks {name}" + (f": {path}" if path != name else ""), fix)
  if include_path is not None:
    for path in pathlib.Path(include_path).glob("**/*.yaml"):  # What lm_eval's index reads.
      input_files.check(path, f"--include_path={include_path}: {path}", fix)


@contextlib.contextmanager
def _expected_errors_as_usage_errors() -> Iterator[None]:
  """lm_eval's named, expected refusals raised as UsageError while the run goes on."""
  from lm_eval.api.task import ConfigurableTask, Task  # pylint: disable=g-import-not-at-top
  from lm_eval.config import evaluate_config  # pylint: disable=g-import-not-at-top
  config = evaluate_config.EvaluatorConfig
  patches = [
      (config, "from_cli", classmethod(_configuration_step(config.from_cli.__func__))),
      (config, "process_tasks", _tasks_built_early(_configuration_step(config.process_tasks))),
      (ConfigurableTask, "__init__", _refusing_no_documents(ConfigurableTask.__init__)),
      (Task, "build_all_requests", _refusing_no_requests(Task.build_all_requests)),
  ]
  with _patched(patches):
    yield


@contextlib.contextmanager
def _patched(patches: Sequence[tuple[Any, str, Any]]) -> Iterator[None]:
  """Sets each (owner, name, value) for the block, then restores what was there (the tests
  call `run` many times in one process)."""
  saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
  try:
    for owner, name, value in patches:
      setattr(owner, name, value)
    yield
  finally:
    for owner, name, value in saved:
      setattr(owner, name, value)


def _configuration_step(method):
  """`method` of lm_eval's EvaluatorConfig with the ValueErrors that module raises itself (its
  refusals of the command's values), and its TypeError for a --config file that is not a
  mapping, as UsageError; one raised deeper keeps its traceback."""
  @functools.wraps(method)
  def checked(*args, **kwargs):
    try:
      return method(*args, **kwargs)
    except (ValueError, TypeError) as e:
      if not _raised_in(e, method.__code__.co_filename) or (
          isinstance(e, TypeError) and not str(e).startswith(_NOT_A_MAPPING)):
        raise
      message = str(e)
      if message.startswith(_NOT_FOUND):
        message = (f"--tasks: lm_eval has no task named {message[len(_NOT_FOUND):]}; "
                   f"{_LISTED} (--include_path adds a folder of task YAML files)")
      elif message == _NO_TASKS:
        message = f"--tasks: missing; give the tasks to evaluate ({_LISTED})"
      elif message.startswith(_NOT_A_MAPPING):
        message = f"--config: {message}; give a YAML mapping of run settings"
      raise UsageError(message) from None
  return checked


def _raised_in(error: BaseException, filename: str) -> bool:
  frames = traceback.extract_tb(error.__traceback__)
  return bool(frames) and frames[-1].filename == filename


def _tasks_built_early(process_tasks):
  """lm_eval's process_tasks (which resolves the task names), then the tasks built at once:
  a task that cannot be built is refused before the model loads. The run's own `load` of
  the same names gets these same objects."""
  @functools.wraps(process_tasks)
  def process_and_build(self, *args, **kwargs):
    manager = process_tasks(self, *args, **kwargs)
    names, built = self.tasks, manager.load(self.tasks)
    load = manager.load

    def load_once(task_list):
      return built if task_list is names else load(task_list)

    manager.load = load_once
    return manager
  return process_and_build


def _refusing_no_documents(init):
  """ConfigurableTask's constructor, which reads its first document: an evaluation split with
  none is refused by name (lm_eval raises datasets' IndexError there)."""
  @functools.wraps(init)
  def checked(self, *args, **kwargs):
    try:
      init(self, *args, **kwargs)
    except IndexError:
      documents = getattr(self, "task_docs", None)
      if documents is None or len(documents) != 0:
        raise
      name = getattr(getattr(self, "config", None), "task", None)
      raise UsageError(f"--tasks {name}: the task's evaluation split holds no documents; "
                       "give a task with data") from None
  return checked


def _refusing_no_requests(build_all_requests):
  """Task.build_all_requests, with lm_eval's refusal of a task left without documents (by
  --samples, or a split emptied on this rank) named."""
  @functools.wraps(build_all_requests)
  def checked(self, *args, **kwargs):
    try:
      return build_all_requests(self, *args, **kwargs)
    except ValueError as e:
      if str(e) != _NO_DOCUMENTS:
        raise
      name = getattr(getattr(self, "config", None), "task", None)
      raise UsageError(f"--tasks {name}: no documents to evaluate (after --limit or "
                       "--samples); give a task with data, or select some of its documents") \
          from None
  return checked


class _MetadataAdvice(logging.Filter):
  """lm_eval's two-line warning, at every task that reads its data through a function (as
  every one of tasks/lm_eval does), that such a function could take `--metadata`: advice for
  task authors, not about the command; left in, no refusal of a task could be one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "Custom kwargs can be passed to `--metadata`" not in record.getMessage()


@contextlib.contextmanager
def _without_metadata_advice() -> Iterator[None]:
  logger = logging.getLogger("lm_eval.api.task")
  advice = _MetadataAdvice()
  logger.addFilter(advice)
  try:
    yield
  finally:
    logger.removeFilter(advice)


@contextlib.contextmanager
def _cache_keyed_by_weights() -> Iterator[None]:
  """lm_eval's CachingLM opens `<use_cache>_rank<N>.db`; for a model that names its weights
  the name gets `-weights-<checksum's first 16 hex digits>` before the extension."""
  from lm_eval.api import model as lm_model  # pylint: disable=g-import-not-at-top
  opened = lm_model.CachingLM.__init__

  def keyed(self, lm, cache_db):
    checksum = getattr(lm, "weights_checksum", None)
    if checksum:
      root, extension = os.path.splitext(cache_db)
      cache_db = f"{root}-weights-{checksum.split(':')[-1][:16]}{extension}"
    opened(self, lm, cache_db)

  with _patched([(lm_model.CachingLM, "__init__", keyed)]):
    yield
