"""The experiment registry: the one open-ended name lookup the command line needs.

Experiments register under their module path below `experiments.` plus the class name
(`experiments/lm/pycode.py:PyCodeTiny` -> `lm.pycode.PyCodeTiny`). A lookup accepts the full
name, any unique dotted suffix (`pycode.PyCodeTiny`, `PyCodeTiny`), or an import path
(`my_project.exps.MyExp`), imported on demand.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import pkgutil
from typing import Any, Callable, TypeVar

import fiddle as fdl

from lingvo_lite.errors import UsageError

_PACKAGE = "experiments"
_REGISTRY: dict[str, type] = {}

T = TypeVar("T", bound=type)


def registered_name(cls: type) -> str:
  module = cls.__module__
  if module.startswith(_PACKAGE + "."):
    module = module[len(_PACKAGE) + 1:]
  return f"{module}.{cls.__qualname__}"


def register(cls: T) -> T:
  """Class decorator that records an experiment; a second class under one name is an error."""
  name = registered_name(cls)
  existing = _REGISTRY.get(name)
  if existing is not None and existing is not cls:
    raise ValueError(f"experiment name {name!r} is registered twice: by "
                     f"{existing.__module__}.{existing.__qualname__} and "
                     f"{cls.__module__}.{cls.__qualname__}")
  _REGISTRY[name] = cls
  return cls


def import_all() -> None:
  """Imports every module under `experiments/`, registering what they define."""
  package = importlib.import_module(_PACKAGE)
  for module in pkgutil.walk_packages(package.__path__, prefix=_PACKAGE + "."):
    importlib.import_module(module.name)


def all_experiments() -> dict[str, type]:
  import_all()
  return dict(sorted(_REGISTRY.items()))


def _suffix_matches(name: str) -> list[str]:
  return [key for key in _REGISTRY if key == name or key.endswith("." + name)]


def _import_object(path: str) -> object | None:
  """`pkg.module.attr` -> the attribute, or None if no such module or attribute exists."""
  module_name, _, attribute = path.rpartition(".")
  if not module_name:
    return None
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if e.name and module_name.startswith(e.name):
      return None  # The module itself is missing, not one of its imports.
    raise
  return getattr(module, attribute, None)


def lookup(name: str, flag: str = "--exp") -> type | Callable[..., object]:
  """Finds an experiment class (or a config-returning function) by name.

  Raises:
    UsageError: unknown (with the closest names) or ambiguous (with every match).
  """
  matches = _suffix_matches(name)
  if not matches:
    # Try the module the name points into before loading every experiment module.
    for candidate in (f"{_PACKAGE}.{name}", name):
      found = _import_object(candidate)
      if found is not None:
        return found
    import_all()
    matches = _suffix_matches(name)
  if len(matches) == 1:
    return _REGISTRY[matches[0]]
  if len(matches) > 1:
    raise UsageError(f"{flag}={name}: ambiguous, matches {', '.join(sorted(matches))}; "
                     "give more of the dotted name")
  close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.5)
  close += [key for key in _REGISTRY
            if key.rsplit(".", 1)[-1].lower() == name.rsplit(".", 1)[-1].lower()]
  hint = (f"did you mean {', '.join(dict.fromkeys(close))}?" if close
          else "run --mode=list to see registered experiments")
  raise UsageError(f"{flag}={name}: no such experiment; {hint}")


def _parse_call(flag: str, text: str) -> tuple[str, dict[str, Any]]:
  """`name` or `name(k=literal, ...)` -> (name, kwargs)."""
  try:
    node = ast.parse(text.strip(), mode="eval").body
  except SyntaxError:
    raise UsageError(f"{flag}={text}: expected NAME or NAME(key=literal, ...)") from None
  if isinstance(node, ast.Call):
    if node.args:
      raise UsageError(f"{flag}={text}: pass arguments by keyword, e.g. fn(num_layers=4)")
    try:
      kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    except ValueError:
      raise UsageError(f"{flag}={text}: arguments must be Python literals") from None
    node = node.func
  else:
    kwargs = {}
  name = ast.unparse(node)
  if not all(part.isidentifier() for part in name.split(".")):
    raise UsageError(f"{flag}={text}: {name!r} is not a dotted name")
  return name, kwargs


def config_from_flag(flag: str, text: str) -> tuple[fdl.Buildable, type | None]:
  """The config an `--exp` / `--fdl_config` value names, and the experiment class if any."""
  name, kwargs = _parse_call(flag, text)
  found = lookup(name, flag=flag)
  experiment = found if inspect.isclass(found) else None
  factory = found.config if experiment is not None else found
  try:
    cfg = factory(**kwargs)
  except TypeError as e:
    raise UsageError(f"{flag}={text}: {e}") from None
  if not isinstance(cfg, fdl.Buildable):
    raise UsageError(f"{flag}={text}: returned a {type(cfg).__name__}, not a fdl.Config")
  return cfg, experiment
