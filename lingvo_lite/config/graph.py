"""The config as a picture: Fiddle's Graphviz rendering of an experiment's config, as SVG.

Each part (the model, the optimizer, each data source, the train loop, ...) is a table of the
fields the experiment and the command line set, with an edge to the field that holds it; a
part two others share (one task under the train and the eval data) is drawn once, with an edge
to each. Fields left at their defaults are not drawn: config.txt lists every field. Graphviz's
`dot` program (Debian's `graphviz` package, which `bin/setup.sh` installs) lays it out.
"""

from __future__ import annotations

import copy
from typing import Any

import fiddle as fdl

from lingvo_lite.errors import UsageError

# A longer value (a source folder's path) is cut in its middle, so that no table grows as wide
# as the rest of the picture. Fiddle's own `max_str_length` would change the config it is
# given and shows a long path, one word, as "..." alone.
MAX_VALUE_CHARS = 60


class _Cut:
  """A value shown by the start and the end of its repr."""

  def __init__(self, text: str):
    keep = (MAX_VALUE_CHARS - 3) // 2
    self._text = f"{text[:keep]}...{text[-keep:]}"

  def __repr__(self) -> str:
    return self._text


def _cut_long_values(value: Any, seen: set[int]) -> None:
  """Replaces, in place, each argument of the Buildables under `value` whose repr is long."""
  if id(value) in seen:
    return
  seen.add(id(value))
  if isinstance(value, fdl.Buildable):
    for name, argument in list(value.__arguments__.items()):
      if isinstance(argument, (fdl.Buildable, list, tuple, dict)):
        _cut_long_values(argument, seen)
      elif len(repr(argument)) > MAX_VALUE_CHARS:
        setattr(value, name, _Cut(repr(argument)))
  elif isinstance(value, (list, tuple)):
    for item in value:
      _cut_long_values(item, seen)
  elif isinstance(value, dict):
    for item in value.values():
      _cut_long_values(item, seen)


def svg(cfg: fdl.Buildable) -> str:
  """`cfg` drawn as an SVG document (`cfg` itself is left as it is).

  Raises:
    UsageError: Graphviz (its `dot` program, or the `graphviz` Python package) is missing.
  """
  try:
    import graphviz  # pylint: disable=g-import-not-at-top
    from fiddle import graphviz as fiddle_graphviz  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UsageError("drawing the config needs the graphviz Python package, which is not "
                     "installed; run bin/setup.sh (it is in requirements.lock)") from None
  shown = copy.deepcopy(cfg)  # One copy keeps shared parts shared.
  _cut_long_values(shown, set())
  try:
    return fiddle_graphviz.render(shown).pipe(format="svg", encoding="utf-8")
  except graphviz.ExecutableNotFound:
    raise UsageError("drawing the config needs Graphviz's dot program, which is not on PATH; "
                     "install Debian's graphviz: apt-get install graphviz, or run "
                     "bin/setup.sh") from None
