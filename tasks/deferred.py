"""A seqio Task made on first use, so configs validate without importing TensorFlow."""

from __future__ import annotations


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

  def __getstate__(self):
    # Beam sends the task to its workers: the recipe travels, the made Task (TensorFlow
    # objects) is made again there.
    return {**self.__dict__, "_task": None}

  def __repr__(self) -> str:
    return f"DeferredTask({self.name!r})"
