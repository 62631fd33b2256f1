"""Importing and calling the user's code (the modules that define experiments, the functions
flags name), with every failure as one line.

Below config/ and data/, which both call it: the registry and `--fiddler` import experiment
modules, and bin/build_store.py's and bin/train_vocab.py's `--task` is a function of the user's.

Three kinds of module hold experiments: those under the built-in `experiments` package (walked
whole), those that installed distributions declare in the `lingvo_lite.experiments` entry-point
group, and user modules named on the command line. A module that fails to import (a syntax
error, an exception at import, a missing dependency) is the user's to fix, so the failure is
described in one line, naming where it was raised, instead of a traceback; so is the failure of a
function of the user's that a flag names (`call_user_code`: an `--exp` config function, the
bin/ tools' `--task`).

A flag's import path (`--exp=pkg.mod.fn`, `--fiddler=pkg.mod.fn`) can name any function on
sys.path, so `foreign_code` tells the user's own code (and the experiments shipped with
lingvo_lite) from the standard library's, an installed distribution's and lingvo_lite's own,
which a flag must not call by accident (`tensorflow.io.gfile.rmtree(path=...)`, `sys.exit`, the
executor's entry point); `kind` names what a path found when it is not a function at all.

Longer than 300 lines with a reason: importing experiment modules and telling the user's code from
foreign code both name where code lives (`_owner`, `_shown_file`): a failure's one line names the
file that raised it, and a refusal names the code's owner.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import pkgutil
import sys
import sysconfig
import traceback
import types
from typing import Any, Callable, TypeVar

import lingvo_lite
from lingvo_lite.runtime.tensorflow_import import import_tensorflow
from lingvo_lite.errors import DataError, UsageError, message_of

ENTRY_POINT_GROUP = "lingvo_lite.experiments"
T = TypeVar("T")
# Packages that import TensorFlow, which prints to stderr while it loads.
_IMPORT_TENSORFLOW = frozenset({"tensorflow", "seqio", "clu", "tensorflow_datasets"})

# Frames of the code that imports or calls the user's code: never where an error was raised.
_CALLERS = {os.path.abspath(__file__)} | {
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config", name)
    for name in ("registry.py", "overrides.py")}


# What importing or calling the user's code may raise that is that code's failure, told in one
# line: SystemExit too (a `sys.exit()` in it must neither end the program silently, with exit 0,
# nor print its message raw), and KeyboardInterrupt and GeneratorExit raised by it.
USER_CODE_FAILURES = (Exception, SystemExit, KeyboardInterrupt, GeneratorExit)


class ImportFailed(Exception):
  """A module exists but importing it raised; the message is one line."""


def describe(error: BaseException) -> str:
  """`Type: first line of the message (at file:line)`, the line where it was raised.

  When that line is in a library (the standard library, a distribution, lingvo_lite) the
  innermost line of the user's own code on the way there follows it: `(at
  fiddle/_src/config.py:530, called from lkf.py:2)`.
  """
  lines = message_of(error).strip().splitlines()
  text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
  if isinstance(error, SyntaxError):
    return text  # Its message already names the file and the line.
  frames = [frame for frame in traceback.extract_tb(error.__traceback__)
            if not frame.filename.startswith("<frozen ")
            and os.path.abspath(frame.filename) not in _CALLERS]
  if not frames:
    return text
  where = f"{_shown_file(frames[-1].filename)}:{frames[-1].lineno}"
  users = [frame for frame in frames if _owner(frame.filename) is None]
  if users and users[-1] is not frames[-1]:
    where += f", called from {_shown_file(users[-1].filename)}:{users[-1].lineno}"
  return f"{text} (at {where})"


def import_module(name: str) -> types.ModuleType | None:
  """Imports `name`; None if no module of that name exists.

  Raises:
    ImportFailed: the module exists but raised while importing, also a ModuleNotFoundError for
      one of its own imports.
  """
  try:
    if name.partition(".")[0] in _IMPORT_TENSORFLOW:
      import_tensorflow()  # Without the lines its C++ runtime prints while loading.
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name and (name == e.name or name.startswith(e.name + ".")):
      return None  # The module (or a package above it) is missing, not one of its imports.
    raise ImportFailed(describe(e)) from None
  # SystemExit too: a module that calls sys.exit() on import must not end `--mode=list`.
  except USER_CODE_FAILURES as e:  # pylint: disable=broad-except
    raise ImportFailed(describe(e)) from None


def call_user_code(function: Callable[..., T], where: str, /, *args: Any, **kwargs: Any) -> T:
  """`function(*args, **kwargs)` for a function of the user's (an `--exp` config function, a
  bin/ tool's `--task`), whose failure is the user's to fix: one line, not a traceback.

  Args:
    function: What to call.
    where: What the message starts with: the flag, its value and the call, e.g.
      `--task='my.task': my.task()`.
    *args: Passed on.
    **kwargs: Passed on, whatever their names (`function` and `where` are positional-only).

  Raises:
    UsageError: `<where> raised <describe(error)>`, naming the line that raised; a UsageError
      or DataError it raised itself (already one line) as it is.
  """
  try:
    return function(*args, **kwargs)
  except (UsageError, DataError):
    raise
  except USER_CODE_FAILURES as e:  # pylint: disable=broad-except
    raise UsageError(f"{where} raised {describe(e)}") from None


def import_tree(package_name: str) -> dict[str, str]:
  """Imports a package and every module below it; returns module -> one-line failure."""
  failures = {}
  try:
    package = import_module(package_name)
  except ImportFailed as e:
    return {package_name: str(e)}
  stack = [package] if package is not None else []
  while stack:
    package = stack.pop()
    for info in pkgutil.iter_modules(package.__path__, prefix=package.__name__ + "."):
      try:
        module = import_module(info.name)
      except ImportFailed as e:
        failures[info.name] = str(e)
        continue
      if module is not None and info.ispkg:
        stack.append(module)
  return failures


def import_entry_points(group: str = ENTRY_POINT_GROUP) -> dict[str, str]:
  """Imports the module of every entry point in `group`; returns module -> one-line failure.

  An entry point's value is a module (`my_exps = my_project.experiments`); an `:attr` after it
  is ignored, since importing the module is what registers its experiments.
  """
  failures = {}
  try:
    entry_points = importlib.metadata.entry_points(group=group)
  except Exception as e:  # pylint: disable=broad-except
    return {f"entry points {group}": describe(e)}  # Some distribution's metadata is broken.
  seen = set()
  for entry_point in entry_points:
    module = entry_point.value.partition(":")[0].strip()
    if module in seen:
      continue  # One distribution found twice on sys.path.
    seen.add(module)
    dist = getattr(entry_point.dist, "name", None)
    where = f"entry point {entry_point.name} = {entry_point.value}" + (
        f" of distribution {dist}" if dist else "") + f" (group {group})"
    if not module or not all(part.isidentifier() for part in module.split(".")):
      failures[module or entry_point.name] = f"{where}: not a dotted module name"
      continue
    try:
      if import_module(module) is None:
        failures[module] = f"{where}: no module named {module!r} on sys.path"
    except ImportFailed as e:
      failures[module] = f"{where}: {e}"
  return failures


# ----------------------------------------------------------------------------- whose code

_HERE = os.path.dirname(os.path.abspath(lingvo_lite.__file__))  # The package's folder.
# lingvo_lite's own code, which a flag may call only where it builds a config or a fiddler.
_OWN_DIRS = (_HERE, os.path.join(os.path.dirname(_HERE), "tasks"))
# The experiments shipped beside lingvo_lite: config code, as the user's own is.
_CONFIG_DIR = os.path.join(os.path.dirname(_HERE), "experiments")
# Where installed distributions live: pip's and Debian's folders (a `pip install -e` project
# stays in its own folder, so it counts as the user's code).
_DISTRIBUTION_DIRS = ("site-packages", "dist-packages")


def _stdlib_dirs() -> tuple[str, ...]:
  paths = sysconfig.get_paths()
  found = {os.path.abspath(paths[key]) for key in ("stdlib", "platstdlib") if paths.get(key)}
  found.add(os.path.dirname(os.path.abspath(os.__file__)))
  return tuple(found)


def _within(path: str, folder: str) -> bool:
  return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _owner(filename: str) -> str | None:
  """Whose code a source file is: "lingvo_lite", "distribution", "stdlib", or None (the
  user's, which includes the experiments shipped with lingvo_lite)."""
  if filename.startswith("<"):
    return None  # `python -c`, exec(), a notebook cell: the user's.
  filename = os.path.abspath(filename)
  if _within(filename, _CONFIG_DIR):
    return None
  if any(_within(filename, folder) for folder in _OWN_DIRS):
    return "lingvo_lite"
  if any(part in _DISTRIBUTION_DIRS for part in filename.split(os.sep)):
    return "distribution"
  if any(_within(filename, folder) for folder in _stdlib_dirs()):
    return "stdlib"
  return None


def _shown_file(filename: str) -> str:
  """A source file as a message shows it: below site-packages or the standard library's
  folder, below lingvo_lite's, or below the working directory; else absolute."""
  path = os.path.abspath(filename)
  owner = _owner(path)
  if owner == "distribution":
    parts = path.split(os.sep)
    last = max(i for i, part in enumerate(parts) if part in _DISTRIBUTION_DIRS)
    return os.sep.join(parts[last + 1:])
  if owner == "stdlib":
    return os.path.relpath(path, max((f for f in _stdlib_dirs() if _within(path, f)), key=len))
  if owner == "lingvo_lite" or _within(path, _CONFIG_DIR):
    return os.path.relpath(path, os.path.dirname(_HERE))
  try:
    cwd = os.getcwd()
  except OSError:
    return path  # The working directory was deleted.
  return os.path.relpath(path) if _within(path, cwd) else path


def _defining_file(obj: object) -> str | None:
  """The source file of a function's or class's module; None when it has none."""
  module = sys.modules.get(getattr(obj, "__module__", None) or "")
  filename = getattr(module, "__file__", None)
  if not filename:
    code = getattr(obj, "__code__", None)  # A function of a module no longer in sys.modules.
    filename = getattr(code, "co_filename", None)
  if not filename or filename.startswith("<"):
    return None
  return os.path.abspath(filename)


def _distribution(module: str) -> str:
  try:
    names = importlib.metadata.packages_distributions().get(module.partition(".")[0]) or []
  except Exception:  # pylint: disable=broad-except
    names = []  # Broken metadata of some distribution: only the name is lost.
  return f"the installed distribution {names[0]}" if names else "an installed distribution"


def code_owner(obj: object) -> str | None:
  """Whose code a function or class is: "stdlib", "distribution", "lingvo_lite", or None for
  the user's own (any module outside those, and the experiments shipped with lingvo_lite)."""
  try:
    obj = inspect.unwrap(obj)  # A decorated function is the code it wraps.
  except ValueError:
    pass  # A cycle of __wrapped__: judge the outer one.
  filename = _defining_file(obj)
  if filename is not None:
    return _owner(filename)
  module = getattr(obj, "__module__", None) or ""
  if module == "builtins" or module.partition(".")[0] in sys.stdlib_module_names:
    return "stdlib"
  return None  # Defined in `python -c`, exec() or a notebook: the user's.


def foreign_code(obj: object) -> str | None:
  """What a function or class is, for a message, unless it is the user's own (None).

  Returns:
    None, or a phrase: `shutil.rmtree is a Python standard library function`,
    `tensorflow.python.lib.io.file_io.delete_recursively_v2 is a function of the installed
    distribution tensorflow`, `lingvo_lite.executor.run_main is part of lingvo_lite itself`.
  """
  owner = code_owner(obj)
  if owner is None:
    return None
  try:
    obj = inspect.unwrap(obj)
  except ValueError:
    pass
  module = getattr(obj, "__module__", None) or ""
  name = f"{module}.{getattr(obj, '__qualname__', type(obj).__name__)}"
  what = "class" if inspect.isclass(obj) else "function"
  if owner == "lingvo_lite":
    return f"{name} is part of lingvo_lite itself"
  if owner == "distribution":
    return f"{name} is a {what} of {_distribution(module)}"
  return f"{name} is a Python standard library {what}"


def kind(found: object) -> str:
  """What an import path found, for a message: `a module`, `a built-in function`, ..."""
  if inspect.ismodule(found):
    return "a module"
  if inspect.isbuiltin(found):
    return "a built-in function"
  if inspect.isclass(found):
    return f"the class {found.__module__}.{found.__qualname__}"
  if inspect.isfunction(found) or inspect.ismethod(found):
    return f"the function {found.__module__}.{found.__qualname__}"
  if callable(found):
    return f"a callable {type(found).__name__}"
  return f"a {type(found).__name__} value"
