"""The experiment registry: the one open-ended name lookup the command line needs.

Experiments register under their module path below `experiments.` plus the class name
(`experiments/lm/pycode.py:PyCodeTiny` -> `lm.pycode.PyCodeTiny`); those of any other module
under their full module path (`my_project.exps.MyExp`). A lookup accepts the full name, any
unique dotted suffix (`pycode.PyCodeTiny`, `PyCodeTiny`, `exps.MyExp`), or an import path to an
experiment class or a config function (`my_project.exps.MyExp`), imported on demand.

Experiment modules are found in three places: every module under the built-in `experiments`
package; the module of every entry point in the `lingvo_lite.experiments` group of an installed
distribution (how a project outside this repository lists its experiments); and modules named by
`--experiments_module` (`import_modules`). A module that fails to import is skipped and reported
by `import_failures()`, so one broken file never hides the others.

Longer than 300 lines with a reason: registering an experiment, finding one by name or dotted
suffix, and reading an `--exp` flag or a config.json's record are the one name lookup above, and
share the check of what a name found (`_check_kind`).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
import re
import types
import typing
from typing import Any, Callable, Collection, Sequence, TypeVar

import fiddle as fdl
from fiddle.experimental import auto_config

from lingvo_lite.config import builtin_packages
from lingvo_lite.runtime import user_code
from lingvo_lite.errors import UsageError

_PACKAGE = "experiments"
_REGISTRY: dict[str, type] = {}
_failures: dict[str, str] = {}  # From the last import_all(): module -> one-line error.
_MISSING = object()

# Before any experiment module is imported (they import this module to @register): a user's
# own `experiments/` or `tasks/` in the working directory must not hide the built-in ones.
builtin_packages.install()

T = TypeVar("T", bound=type)


def registered_name(cls: type) -> str:
  """`experiments.lm.pycode.PyCodeTiny` -> `lm.pycode.PyCodeTiny`; other modules stay whole."""
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


def _forget(modules: Collection[str]) -> None:
  """Drops what modules that then failed registered, so a retried import can register again."""
  for name, cls in list(_REGISTRY.items()):
    if cls.__module__ in modules:
      del _REGISTRY[name]


def import_all() -> None:
  """Imports every experiment module: the `experiments` package and the entry points.

  A module that fails is skipped (see `import_failures()`); the rest still register.
  """
  failures = user_code.import_tree(_PACKAGE)
  failures.update(user_code.import_entry_points())
  _forget(failures)
  _failures.clear()
  _failures.update(failures)


def import_failures() -> dict[str, str]:
  """Module -> one-line reason, for each experiment module the last `import_all()` could not
  import (and each user module a built-in package's name hides); print one warning each."""
  return dict(sorted({**builtin_packages.hidden(), **_failures}.items()))


def import_modules(names: Sequence[str], flag: str = "--experiments_module") -> None:
  """Imports the modules a flag names (`my_project.exps`), registering their experiments.

  Raises:
    UsageError: a name that is not a dotted name, is not found, or fails to import.
  """
  for name in (name.strip() for name in names):
    if not name:
      continue
    if not all(part.isidentifier() for part in name.split(".")):
      raise UsageError(f"{flag}={name}: not a dotted module name; e.g. {flag}=my_project.exps")
    module = _import(name, f"{flag}={name}")
    if module is None:
      raise UsageError(f"{flag}={name}: no module named {name!r}; run from the folder that "
                       "holds it or add that folder to PYTHONPATH")


def _import(module_name: str, where: str) -> Any:
  """The module, or None if it does not exist; one UsageError if importing it fails (and
  whatever it registered before failing is forgotten, so a retry can register again)."""
  try:
    return user_code.import_module(module_name)
  except user_code.ImportFailed as e:
    _forget([module_name])
    raise UsageError(f"{where}: importing module {module_name} failed: {e}") from None


def all_experiments() -> dict[str, type]:
  """Every registered experiment by name, after importing every experiment module."""
  import_all()
  return dict(sorted(_REGISTRY.items()))


def _suffix_matches(name: str) -> list[str]:
  return [key for key in _REGISTRY if key == name or key.endswith("." + name)]


def _resolve(path: str, flag: str, name: str) -> tuple[object, str | None]:
  """The object at import path `pkg.module.attr...`: (object or _MISSING, note on why not).

  Raises:
    UsageError: a module on the path exists but fails to import.
  """
  parts = path.split(".")
  for i in range(len(parts) - 1, 0, -1):  # The longest module prefix that exists.
    module_name = ".".join(parts[:i])
    found = _import(module_name, f"{flag}={name}")
    if found is None:
      continue
    for j in range(i, len(parts)):
      owner, found = found, getattr(found, parts[j], _MISSING)
      if found is _MISSING:
        if getattr(owner, "__name__", None) == _PACKAGE:
          return _MISSING, None  # Not found below `experiments.`: the registry may know it.
        return _MISSING, f"{'.'.join(parts[:j])} has no attribute {parts[j]!r}"
    return found, None
  return _MISSING, None


def _returns_config(fn: object) -> bool:
  """Whether a function's return annotation names a Fiddle config (`-> fdl.Config[Setup]`)."""
  try:
    annotation = typing.get_type_hints(fn).get("return")
  except Exception:  # pylint: disable=broad-except
    annotation = (getattr(fn, "__annotations__", None) or {}).get("return")
  if isinstance(annotation, str):  # Unresolvable under `from __future__ import annotations`.
    return bool(re.match(r"(fdl\.|fiddle\.)?(Config|Buildable|Partial)\b", annotation.strip()))
  options = typing.get_args(annotation) if typing.get_origin(annotation) in (
      typing.Union, types.UnionType) else (annotation,)
  for option in options:
    option = typing.get_origin(option) or option
    if isinstance(option, type) and issubclass(option, fdl.Buildable):
      return True
  return False


def _is_experiment_class(cls: type) -> bool:
  return cls in _REGISTRY.values() or any(
      klass.__module__ == "lingvo_lite.experiment" and klass.__name__ == "Experiment"
      for klass in cls.__mro__)


def _check_kind(found: object, flag: str, name: str) -> type | Callable[..., object]:
  """Only experiment classes and config functions may be called by a flag's import path.

  An import path could name anything (`os.remove`, `tensorflow.io.gfile.rmtree`, the CLI's
  own entry point): only the user's own functions (see `user_code.foreign_code`),
  and any function annotated to return a Fiddle config, are called, and only classes with a
  `config` classmethod. That keeps a typo from doing harm, and gives a plain message instead
  of a confusing TypeError. (The command line is the user's own: this guards against
  accidents, not against attacks.)
  """
  where = f"{flag}={name}"
  fix = "name an experiment (see --mode=list) or a function returning a fdl.Config"
  if inspect.isclass(found):
    config = inspect.getattr_static(found, "config", None)
    if not isinstance(config, (classmethod, staticmethod)):
      raise UsageError(f"{where}: the class {found.__module__}.{found.__qualname__} has no "
                       "config() classmethod; an experiment subclasses "
                       "lingvo_lite.experiment.Experiment and returns its config from config()")
    foreign = user_code.foreign_code(found)
    if foreign and not _is_experiment_class(found) and not _returns_config(found.config):
      raise UsageError(f"{where}: {foreign}, not an experiment (it does not subclass "
                       f"lingvo_lite.experiment.Experiment); {fix}")
    return found
  if isinstance(found, auto_config.AutoConfig):
    return found
  function = found.__func__ if inspect.ismethod(found) else found
  if inspect.isfunction(function):
    foreign = user_code.foreign_code(function)
    if foreign and not _returns_config(function):
      raise UsageError(f"{where}: {foreign}, not a config function; {fix}")
    return found
  raise UsageError(f"{where}: is {user_code.kind(found)}, not an experiment class or "
                   "a function returning a fdl.Config; see --mode=list")


def _is_module(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except Exception:  # pylint: disable=broad-except
    return False  # A parent package is missing or fails: not a module we can name.


def lookup(name: str, flag: str = "--exp") -> type | Callable[..., object]:
  """Finds an experiment class (or a config-returning function) by name.

  Raises:
    UsageError: unknown (with the closest names, and any experiment module that failed to
      import), ambiguous (with every match), a module that fails to import, or an import path
      to something that is neither an experiment class nor a config function.
  """
  matches = _suffix_matches(name)
  note = None
  if not matches:
    # Try the module the name points into before loading every experiment module.
    for candidate in (f"{_PACKAGE}.{name}", name):
      found, candidate_note = _resolve(candidate, flag, name)
      if found is not _MISSING:
        return _check_kind(found, flag, name)
      note = note or candidate_note
    import_all()
    matches = _suffix_matches(name)
  if len(matches) == 1:
    return _REGISTRY[matches[0]]
  if len(matches) > 1:
    raise UsageError(f"{flag}={name}: ambiguous, matches {', '.join(sorted(matches))}; "
                     "give more of the dotted name")
  if _is_module(f"{_PACKAGE}.{name}") or _is_module(name):
    raise UsageError(f"{flag}={name}: is a module, not an experiment; name an experiment class "
                     f"or config function in it ({flag}={name}.NAME), see --mode=list")
  close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.5)
  close += [key for key in _REGISTRY
            if key.rsplit(".", 1)[-1].lower() == name.rsplit(".", 1)[-1].lower()]
  hint = (f"did you mean {', '.join(dict.fromkeys(close))}?" if close
          else "run --mode=list to see registered experiments")
  raise UsageError(f"{flag}={name}: no such experiment{f' ({note})' if note else ''}; {hint}"
                   f"{_failures_note()}")


def _failures_note() -> str:
  if not _failures:
    return ""
  if len(_failures) == 1:
    ((module, error),) = _failures.items()
    return f"; experiment module {module} failed to import: {error}"
  return (f"; {len(_failures)} experiment modules failed to import: "
          f"{', '.join(sorted(_failures))} (see --mode=list)")


# Far longer than any experiment name with its arguments: Python's parser needs stack and
# memory in proportion to the text (5000 nested `-` overflow its stack), and a message
# echoes it.
MAX_FLAG_LENGTH = 10_000


def _parse_call(flag: str, text: str) -> tuple[str, dict[str, Any]]:
  """`name` or `name(k=literal, ...)` -> (name, kwargs)."""
  if len(text) > MAX_FLAG_LENGTH:
    raise UsageError(f"{flag}: the value is {len(text)} characters long, more than the "
                     f"{MAX_FLAG_LENGTH} an experiment name and its arguments may have; set "
                     "large values in the experiment or a fiddler")
  try:
    node = ast.parse(text.strip(), mode="eval").body
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    # ValueError: a NUL byte; RecursionError, MemoryError: deep nesting.
    raise UsageError(f"{flag}={text}: expected NAME or NAME(key=literal, ...)") from None
  if isinstance(node, ast.Call):
    if node.args or any(kw.arg is None for kw in node.keywords):  # `f(1)`, `f(**d)`.
      raise UsageError(f"{flag}={text}: pass arguments by keyword, e.g. fn(num_layers=4)")
    try:
      kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
      raise UsageError(f"{flag}={text}: arguments must be Python literals") from None
    node = node.func
  else:
    kwargs = {}
  try:
    name = ast.unparse(node)
  except (RecursionError, MemoryError):  # `a.a.a...` thousands deep.
    raise UsageError(f"{flag}={text}: expected NAME or NAME(key=literal, ...)") from None
  if not all(part.isidentifier() for part in name.split(".")):
    raise UsageError(f"{flag}={text}: {name!r} is not a dotted name")
  return name, kwargs


def config_from_flag(flag: str, text: str) -> tuple[fdl.Buildable, type | None]:
  """The config an `--exp` / `--fdl_config` value names, and the experiment class if any."""
  name, kwargs = _parse_call(flag, text)
  found = lookup(name, flag=flag)
  experiment = found if inspect.isclass(found) else None
  if experiment is not None:
    factory = signed = experiment.config
    label = f"{experiment.__qualname__}.config"
  elif isinstance(found, auto_config.AutoConfig):
    factory, signed, label = found.as_buildable, found.func, found.func.__qualname__
  else:
    factory = signed = found
    label = f"{found.__module__}.{found.__qualname__}"
  try:
    signature = inspect.signature(signed)
  except (TypeError, ValueError):
    signature = None  # No signature to check; the call itself will say.
  if signature is not None:
    try:
      signature.bind(**kwargs)  # Before calling: a wrong argument runs none of the user's code.
    except TypeError as e:
      takes = ", ".join(signature.parameters) or "no arguments"
      raise UsageError(f"{flag}={text}: {e}; {label}() takes {takes}") from None
  # A bug in the user's experiment code, met before any device time: one line naming the
  # experiment, the exception and the line that raised it, exit 2, as for other config
  # mistakes (exit 1 is for runs that failed after they started). That line is what a
  # traceback's last frame would say; a deeper bug can be chased by calling config() in Python.
  cfg = user_code.call_user_code(factory, f"{flag}={text}: {label}()", **kwargs)
  if not isinstance(cfg, fdl.Buildable):
    raise UsageError(f"{flag}={text}: {label}() returned a {type(cfg).__name__}, not a "
                     "fdl.Config")
  return cfg, experiment


def recorded_class(import_path: str) -> tuple[type | None, Exception | None]:
  """The class at `import_path`, where a job's config.json recorded its experiment: the
  reloaded config runs without it, so its absence is no error here.

  Returns:
    (the class, None); (None, None) where the module or the name is gone or is no longer a
    class; (None, the exception) where importing the module raised (user code: anything).
  """
  module_name, _, attribute = import_path.rpartition(".")
  try:
    found = getattr(importlib.import_module(module_name), attribute, None)
  except Exception as e:  # pylint: disable=broad-except
    return None, e
  return (found, None) if inspect.isclass(found) else (None, None)
