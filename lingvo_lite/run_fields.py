"""Which fields of a part say how it runs, marked once on the field's annotation.

A model's fields mostly say what it computes (its sizes, its norms, its attention kinds); a few
say how it is run (`dtype`, `scan_layers`, `remat_policy`, `attention_implementation`,
`quantization`, a mixture of experts' `dispatch`) or trained (an initialization's scale, an
auxiliary loss's weight). Those are marked where they are declared:

  scan_layers: Annotated[bool, RUN] = False
  dtype: Annotated[layers.DType, Run(resumable=False)] = "float32"
  embedding_init_stddev: Annotated[PositiveFloat, TRAINING] = 0.02

and every list of them is derived from the marks (`names`), never written out again:

  - a weight format leaves them out of what it describes (models/transformer_names.py: a
    config.json need not say them, and an export is not refused for them);
  - a weight source that describes its model keeps the experiment's `carried` ones
    (weights/sources.py: `--init_from=hf:PATH` runs the folder's model as the experiment says);
  - a resumed run may change the `resumable` ones (the family's `resumable_fields`,
    config/files.py).

A mark is inherited: a subclass that declares the field again, to change its default, keeps it.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Annotated, Any

from lingvo_lite import fields


@dataclasses.dataclass(frozen=True)
class Run:
  """Marks a field of how a part is run or trained, not of the function its parameters
  compute.

  Attributes:
    resumable: A resumed run may change it: the checkpoint's parameters stay what they were
      and compute what they computed (False for the dtypes, which a run keeps).
    carried: A weight source that describes its model (a Hugging Face config.json) keeps the
      experiment's value: how to run the model is the experiment's choice. False for how the
      model is trained (an initialization, an objective's weight): the source's or the
      family's value.
  """

  resumable: bool = True
  carried: bool = True


RUN = Run()
TRAINING = Run(carried=False)


@functools.lru_cache(maxsize=None)
def marked(owner: type) -> dict[str, Run]:
  """Each field of the class `owner` marked `Run`, in `owner` or a class it inherits from
  (a later declaration's mark replaces an earlier one; one without a mark keeps it)."""
  found: dict[str, Run] = {}
  for klass in reversed(owner.__mro__):
    own = vars(klass).get("__annotations__", {})
    hints = fields.type_hints(klass) if own else {}
    for name in own:
      annotation = hints.get(name)
      if typing.get_origin(annotation) is Annotated:
        marks = [m for m in annotation.__metadata__ if isinstance(m, Run)]
        if marks:
          found[name] = marks[0]
  return found


def names(owner: type, **wanted: bool) -> tuple[str, ...]:
  """The fields of `owner` marked `Run` whose mark has each attribute of `wanted`
  (`names(cls, resumable=True)`), in declaration order; every marked field for none."""
  return tuple(name for name, mark in marked(owner).items()
               if all(getattr(mark, key) == value for key, value in wanted.items()))


class Marked:
  """A class attribute that lists the class's marked fields (`names(cls, **wanted)`), derived
  from the marks of whichever class it is read on (a subclass's fields included)."""

  def __init__(self, **wanted: bool):
    self._wanted = wanted

  def __get__(self, instance: Any, owner: type) -> tuple[str, ...]:
    return names(owner, **self._wanted)
