"""Type checks of a whole config tree, before anything in it is built.

`fdl.build` hands each constructor whatever its config holds: a literal where a part is
expected (`--fdl.model=3`), None in a field that is not Optional, nothing for a required
argument. Each of those fails deep in a constructor, or later still, with a traceback. This
module walks the tree first, whatever produced it (the experiment, fiddlers, `--fdl.` sets, a
config.json), and checks every argument of every Buildable against its callable's annotation
and the constraints declared with it (`lingvo_lite.fields`), naming the config path the way
`--fdl.` spells it: `model.num_layers`, `eval_data.held_out.num_batches` for an entry of a
dict (`eval_data['held out']` for a key that is not an identifier), `train_data.sources[0]`.
"""

from __future__ import annotations

import inspect
from typing import Any

import fiddle as fdl

from lingvo_lite import fields
from lingvo_lite.errors import UsageError


def check(cfg: Any) -> None:
  """Raises UsageError, one line naming the path, for the first argument that cannot build."""
  _check(cfg, "", set())


def built_type(value: Any) -> type | None:
  """The type a config value will have once built; None when that is not known."""
  if isinstance(value, fdl.Config):
    fn = fdl.get_callable(value)
    if isinstance(fn, type):
      return fn
    returned = fields.type_hints(fn).get("return")
    return returned if isinstance(returned, type) else None
  if isinstance(value, fdl.Buildable):
    return None  # A Partial builds into a callable, which no field here is annotated with.
  return type(value)


def unset_required(cfg: fdl.Buildable) -> list[str]:
  """The parameters of `cfg`'s own callable that have no default and that `cfg` does not set
  (a Setup config without `train_data`: `['train_data']`)."""
  try:
    parameters = inspect.signature(fdl.get_callable(cfg)).parameters.values()
  except (TypeError, ValueError):
    return []
  return [p.name for p in parameters if p.default is p.empty and p.name not in
          cfg.__arguments__ and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def how_to_set(path: str, annotation: Any) -> str:
  """The fix for a required field left unset: a value is one `--fdl.` flag away; a part (a
  model, a data source) is a config, which only the experiment (or a fiddler) can give, or
  None where None is allowed."""
  if annotation is None or not fields.is_part(annotation):
    return f"give it in the experiment or with --fdl.{path}=VALUE"
  if fields.matches(None, annotation):
    return f"give it in the experiment, or --fdl.{path}=None for none"
  return f"give it in the experiment's config() (a config of {fields.describe(annotation)})"


def _check(value: Any, path: str, seen: set[int]) -> None:
  if isinstance(value, (dict, list, tuple)):
    for key, item in fields.entries(value):
      _check(item, fields.path_join(path, key), seen)
    return
  if not isinstance(value, fdl.Buildable) or id(value) in seen:
    return
  seen.add(id(value))  # A config shared by two fields is checked once.
  fn = fdl.get_callable(value)
  hints = fields.type_hints(fn)
  arguments = value.__arguments__
  try:
    parameters = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return  # A callable without a signature (some builtins): nothing to check against.
  for name, parameter in parameters.items():
    if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
      continue
    field_path = fields.path_join(path, name)
    if name not in arguments:
      if parameter.default is parameter.empty and isinstance(value, fdl.Config):
        raise UsageError(f"{field_path}: required by {getattr(fn, '__name__', fn)} and not "
                         f"set; {how_to_set(field_path, hints.get(name))}")
      continue
    argument = arguments[name]
    if name in hints:
      _check_argument(field_path, argument, hints[name])
    _check(argument, field_path, seen)
  for name, argument in arguments.items():
    if name not in parameters:  # Taken by **kwargs: no annotation, but it may hold configs.
      _check(argument, fields.path_join(path, str(name)), seen)


def _check_argument(path: str, argument: Any, annotation: Any) -> None:
  if isinstance(argument, dict) and fields.matches(argument, annotation, built_type) is False:
    # A config in a dict entry is named by the entry's path; `fields.check` names the rest.
    for key, entry in argument.items():
      inner = fields.entry_annotation(annotation, argument, key)
      if isinstance(entry, fdl.Buildable) and inner is not None:
        _check_argument(fields.path_join(path, key), entry, inner)
  if not isinstance(argument, fdl.Buildable):
    fields.check(path, argument, annotation, built_type)
  elif fields.matches(argument, annotation, built_type) is False:
    built = getattr(fdl.get_callable(argument), "__name__", "?")
    raise UsageError(f"{path}=<config of {built}>: must be {fields.describe(annotation)}; "
                     f"give a config of {fields.describe(annotation)} instead")
