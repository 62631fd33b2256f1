"""What a run asks of a seqio Task, said by a task that knows it without being made.

Making a seqio Task imports seqio, and with it TensorFlow: about 5 s of CPU, more than the rest
of a small run's start. A run whose token stores are built reads none of the Task's data; it
asks the Task only for facts: its vocabulary's fingerprint, size and byte lengths (the data
checks, eval's bits per byte), its input files and preprocessors (the store's key, which says
whether the store on disk is still the Task's) and its metric functions. A task whose recipe
knows those facts (tasks.deferred.DeferredTask, for the tasks of tasks/) gives them as
`TaskFacts`, and the store code asks `facts_of(task)` before it makes the Task; building a
store, decoding text and running metrics still make it.

A task's facts must be what its made Task says: each task's tests compare the two
(tests/data/test_task_facts.py), since a store keyed by wrong facts would be read as current.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from lingvo_lite.data.vocabulary import VocabularyFacts


@dataclasses.dataclass(frozen=True)
class TaskFacts:
  """A seqio Task's facts, known without making it.

  Attributes:
    vocabulary: Its targets vocabulary's fingerprint, size and byte lengths.
    preprocessors: Each preprocessor as a store's key describes it
      (`store_build.describe_preprocessor`).
    input_files: split -> the input files its source lists (`source.list_shards(split)`),
      raising what listing them raises.
  The Task has no metric functions: a task with some is made to be asked (seqio checks their
  signatures).
  """
  vocabulary: VocabularyFacts
  preprocessors: tuple[str, ...]
  input_files: Callable[[str], list[str]]


def facts_of(task: Any) -> TaskFacts | None:
  """The task's facts where it gives them (a `facts` attribute that is a TaskFacts), else
  None: the caller asks the made Task."""
  facts = getattr(task, "facts", None)
  return facts if isinstance(facts, TaskFacts) else None
