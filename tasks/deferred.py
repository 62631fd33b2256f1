"""A seqio Task made on first use, so configs validate without importing TensorFlow; and a
task named by an import path, as the bin/ tools take one.

A task's functions are the user's code: whatever they raise (a module that fails to import, a
task function or a recipe that raises, calls `sys.exit()`, or returns something else) is one
line naming the flag, the call and the line that raised, as for the executor's `--exp`
(`lingvo_lite.runtime.user_code`), never a traceback.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from lingvo_lite.data.task_facts import TaskFacts
from lingvo_lite.runtime import user_code
from lingvo_lite.errors import UsageError, config_error, shown

# What a task is used through: a seqio Task and a DeferredTask have all three.
_TASK_ATTRIBUTES = ("name", "splits", "source")
_MISSING = object()


class DeferredTask:
  """A seqio Task made on first use: what a config needs to validate (its name, splits and
  vocabulary size) without TensorFlow, whose import alone takes 2.5 s, so `--mode=print`
  and `--mode=compile` of the PyCode experiments never load it. `get_dataset` and
  `output_features` make the Task (and raise the UsageError of a missing seqio).

  `facts`, where the recipe gives it, says what a run asks of the Task whose token stores are
  built (lingvo_lite.data.task_facts), so such a run never makes it: a callable returning the
  made Task's TaskFacts, or None where it cannot know them unmade.
  """

  def __init__(self, name: str, splits: tuple[str, ...], vocab_size: int, make,
               facts: Callable[[], TaskFacts | None] | None = None):
    self.name, self.splits, self.vocab_size, self._make = name, splits, vocab_size, make
    self._task = None
    self._facts_recipe = facts
    self._facts: tuple[TaskFacts | None] | None = None  # (facts,) once asked.

  @property
  def facts(self) -> TaskFacts | None:
    if self._facts is None:
      self._facts = (None if self._facts_recipe is None else user_code.call_user_code(
          self._facts_recipe, f"task={self.name!r}: its facts"),)
    return self._facts[0]

  @property
  def task(self):
    if self._task is None:
      self._task = user_code.call_user_code(
          self._make, f"task={self.name!r}: making the seqio Task")
    return self._task

  @property
  def output_features(self):
    return self.task.output_features

  def get_dataset(self, *args, **kwargs):
    return self.task.get_dataset(*args, **kwargs)

  @property
  def source(self):
    return self.task.source

  def preprocess_precache(self, *args, **kwargs):
    return self.task.preprocess_precache(*args, **kwargs)

  def preprocess_postcache(self, *args, **kwargs):
    return self.task.preprocess_postcache(*args, **kwargs)

  @property
  def preprocessors(self):
    return self.task.preprocessors

  @property
  def score_metric_fns(self):
    return self.task.score_metric_fns

  @property
  def predict_metric_fns(self):
    return self.task.predict_metric_fns

  def postprocess_fn(self, *args, **kwargs):
    return self.task.postprocess_fn(*args, **kwargs)

  def __getstate__(self):
    # Beam sends the task to its workers: the recipe travels, the made Task (TensorFlow
    # objects) is made again there.
    return {**self.__dict__, "_task": None, "_facts": None}

  def __repr__(self) -> str:
    return f"DeferredTask({self.name!r})"


def load_task(import_path: str, flag: str = "--task") -> Any:
  """Calls the function at `module.function` (the bin/ tools' `--task`) and returns its task.

  The module is imported, and the function called, as the executor imports an experiment
  module and calls a config function (`runtime/user_code.py`): a failure is one line.

  Raises:
    UsageError: naming `flag` when the path does not import, names no function of the user's
      or of tasks/, needs arguments, raises, or returns something that is not a task with
      splits.
  """
  fix = "give module.function, e.g. tasks.pycode.pycode_task"
  module_name, _, function_name = import_path.rpartition(".")
  if not module_name or not all(part.isidentifier() for part in import_path.split(".")):
    raise config_error(flag, import_path, "not an import path", fix)
  where = f"{flag}={shown(import_path)}"
  try:
    module = user_code.import_module(module_name)
  except user_code.ImportFailed as e:
    raise UsageError(f"{where}: importing module {module_name} failed: {e}") from None
  if module is None:
    raise config_error(flag, import_path, f"no module named {module_name!r}", fix)
  function = inspect.getattr_static(module, function_name, None)
  if function is None or not callable(function):
    raise config_error(flag, import_path, f"module {module_name} has no function "
                       f"{function_name!r}", fix)
  function = getattr(module, function_name)  # A staticmethod or the like, bound.
  _check_owner(function, where, fix)
  try:
    signature = inspect.signature(function)
  except (TypeError, ValueError):
    signature = None  # No signature to check (a C function): the call itself will say.
  if signature is not None:
    try:
      signature.bind()  # Before calling: a function that needs arguments runs none of its code.
    except TypeError as e:
      raise config_error(flag, import_path, f"cannot be called with no arguments ({e})",
                         "give a function that returns a task by itself") from None
  task = user_code.call_user_code(function, f"{where}: {import_path}()")
  _check_task(task, where)
  return task


def _check_owner(function: Any, where: str, fix: str) -> None:
  """An import path could name anything (`os.abort`, `shutil.rmtree`, lingvo_lite's entry
  points): a standard library function or lingvo_lite's own code outside tasks/ is not called,
  so that a typo does no harm. (The command line is the user's own: this guards against
  accidents, not attacks.)"""
  owner = user_code.code_owner(function)
  if owner == "stdlib" or (owner == "lingvo_lite" and not getattr(
      function, "__module__", "").startswith("tasks.")):
    raise UsageError(f"{where}: {user_code.foreign_code(function)}, not a task "
                     f"function; {fix}")


def _check_task(task: Any, where: str) -> None:
  """A seqio Task or a DeferredTask, with a name and at least one split (read without making
  a DeferredTask, whose recipe imports TensorFlow)."""
  fix = "give a function that returns a seqio Task or DeferredTask"
  missing = [name for name in _TASK_ATTRIBUTES
             if inspect.getattr_static(task, name, _MISSING) is _MISSING]
  if missing:
    if inspect.iscoroutine(task) or inspect.isgenerator(task):
      task.close()  # Never run: else Python warns at exit that it was never awaited.
    raise UsageError(f"{where}: returned a {type(task).__name__}, not a seqio Task (it has no "
                     f"{missing[0]!r}); {fix}")
  name, splits = user_code.call_user_code(
      lambda: (task.name, tuple(task.splits)), f"{where}: reading the task's name and splits")
  if not isinstance(name, str) or not name:
    raise UsageError(f"{where}: returned a task named {shown(name)}, not a name; {fix}")
  if not splits or not all(isinstance(split, str) and split for split in splits):
    raise UsageError(f"{where}: returned the task {name!r} with splits {shown(splits)}; "
                     f"{fix} with named splits")
