"""A seqio Task made on first use, so configs validate without importing TensorFlow; and a
task named by an import path, as the bin/ tools take one."""

from __future__ import annotations

import importlib
from typing import Any

from lingvo_lite.errors import config_error


class DeferredTask:
  """A seqio Task made on first use: what a config needs to validate (its name, splits and
  vocabulary size) without TensorFlow, whose import alone takes 2.5 s, so `--mode=print`
  and `--mode=compile` of the PyCode experiments never load it. `get_dataset` and
  `output_features` make the Task (and raise the UsageError of a missing seqio)."""

  def __init__(self, name: str, splits: tuple[str, ...], vocab_size: int, make):
    self.name, self.splits, self.vocab_size, self._make = name, splits, vocab_size, make
    self._task = None

  @property
  def task(self):
    if self._task is None:
      self._task = self._make()
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
    return {**self.__dict__, "_task": None}

  def __repr__(self) -> str:
    return f"DeferredTask({self.name!r})"


def load_task(import_path: str) -> Any:
  """Calls the function at `module.function` (the bin/ tools' `--task`) and returns its task.

  Raises:
    UsageError: naming `--task` when the path does not import or the function needs arguments.
  """
  module_name, _, function_name = import_path.rpartition(".")
  fix = "give module.function, e.g. tasks.pycode.pycode_task"
  if not module_name or not function_name:
    raise config_error("--task", import_path, "not an import path", fix)
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    raise config_error("--task", import_path, f"no module named {e.name!r}", fix) from None
  except ImportError as e:
    raise config_error("--task", import_path, f"module {module_name} failed to import ({e})",
                       fix) from None
  function = getattr(module, function_name, None)
  if not callable(function):
    raise config_error("--task", import_path, f"module {module_name} has no function "
                       f"{function_name!r}", fix)
  try:
    return function()
  except TypeError as e:  # It needs arguments: the command line has none to give it.
    raise config_error("--task", import_path, f"cannot be called with no arguments ({e})",
                       "give a function that returns a task by itself") from None
