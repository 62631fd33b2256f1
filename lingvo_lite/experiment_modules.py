"""Importing the modules that define experiments, with every failure as one line.

Three kinds of module hold experiments: those under the built-in `experiments` package (walked
whole), those that installed distributions declare in the `lingvo_lite.experiments` entry-point
group, and user modules named on the command line. A module that fails to import (a syntax
error, an exception at import, a missing dependency) is the user's to fix, so the failure is
described in one line, naming where it was raised, instead of a traceback.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import pkgutil
import traceback
import types

ENTRY_POINT_GROUP = "lingvo_lite.experiments"

# Frames of the code that imports or calls the user's code: never where an error was raised.
_CALLERS = {os.path.abspath(__file__),
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "registry.py")}


class ImportFailed(Exception):
  """A module exists but importing it raised; the message is one line."""


def describe(error: BaseException) -> str:
  """`Type: first line of the message (at file:line)`, the line where it was raised."""
  lines = str(error).strip().splitlines()
  text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
  if isinstance(error, SyntaxError):
    return text  # Its message already names the file and the line.
  frames = [frame for frame in traceback.extract_tb(error.__traceback__)
            if not frame.filename.startswith("<frozen ")
            and os.path.abspath(frame.filename) not in _CALLERS]
  if not frames:
    return text
  filename = frames[-1].filename
  if os.path.abspath(filename).startswith(os.getcwd() + os.sep):
    filename = os.path.relpath(filename)
  return f"{text} (at {filename}:{frames[-1].lineno})"


def import_module(name: str) -> types.ModuleType | None:
  """Imports `name`; None if no module of that name exists.

  Raises:
    ImportFailed: the module exists but raised while importing, also a ModuleNotFoundError for
      one of its own imports.
  """
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name and (name == e.name or name.startswith(e.name + ".")):
      return None  # The module (or a package above it) is missing, not one of its imports.
    raise ImportFailed(describe(e)) from None
  # SystemExit too: a module that calls sys.exit() on import must not end `--mode=list`.
  except (Exception, SystemExit) as e:  # pylint: disable=broad-except
    raise ImportFailed(describe(e)) from None


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
