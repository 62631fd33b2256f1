"""The built-in top-level packages, `experiments` and `tasks`, always resolve to lingvo_lite's.

They sit next to the `lingvo_lite` package: in the repository root, in site-packages after
`pip install .`, in a Bazel runfiles tree. `python -m lingvo_lite` puts the working directory
first on sys.path, so a user's project with its own `experiments/` or `tasks/` package would
hide them (`--mode=list` would list only the user's modules, `--exp=PyCodeTiny` would not be
found, and `from tasks import pycode` in a built-in experiment would fail).

`install()` (called when `lingvo_lite.config.registry` is imported, before any experiment module is)
then loads ours under those names, and keeps the user's package as a second folder of the
package's `__path__`: `experiments.mine` still imports the user's `experiments/mine.py` (and
`--mode=list` lists its experiments, as `mine.NAME`), `tasks.mine` the user's `tasks/mine.py`.
Where both hold a module of one name (`experiments/lm/`), ours wins and `hidden()` reports the
user's one. The user's `__init__.py` is not run: ours is. A user's module file of that name
(`tasks.py`) is not importable by that name while lingvo_lite is loaded.

Why not rename ours (say `lingvo_lite_experiments`)? The folders are the documented layout,
`import experiments.lm.pycode` is how experiments reuse each other, and registered names
(`lm.pycode.PyCodeTiny`) are relative to `experiments`; taking the name is less surprising than
either breaking those or losing the built-ins in any project that mirrors our layout.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Sequence

import lingvo_lite

NAMES = ("experiments", "tasks")

# Qualified module name -> why the user's module of that name cannot be imported.
_hidden: dict[str, str] = {}


def builtin_dir(name: str) -> str | None:
  """The folder of our package `name` (beside `lingvo_lite/`), or None if not installed."""
  # abspath, not realpath: under Bazel the runfiles tree links back to the source tree, and
  # resolving the links would step out of the runfiles.
  root = os.path.dirname(os.path.dirname(os.path.abspath(lingvo_lite.__file__)))
  folder = os.path.join(root, name)
  return folder if os.path.isfile(os.path.join(folder, "__init__.py")) else None


def install(names: Sequence[str] = NAMES) -> None:
  """Makes each of `names` resolve to our package; a no-op where it already does."""
  for name in names:
    folder = builtin_dir(name)
    if folder is not None:
      ensure(name, folder)


def hidden() -> dict[str, str]:
  """Module name -> one line on why the user's module of that name is not importable."""
  return dict(_hidden)


def _same(a: str, b: str) -> bool:
  try:
    return os.path.samefile(a, b)
  except OSError:
    return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


def ensure(name: str, folder: str) -> types.ModuleType | None:
  """Makes the top-level package `name` the one in `folder`.

  Args:
    name: A top-level package name.
    folder: The package's folder (holding its `__init__.py`).

  Returns:
    The module if it was loaded here (the name resolved elsewhere), else None.
  """
  module = sys.modules.get(name)
  if module is not None:
    path = getattr(module, "__path__", None)
    if path is not None and not any(_same(p, folder) for p in path):
      # Someone imported the other package before lingvo_lite.config.registry. Swapping it out now
      # would leave its imported submodules under a replaced parent, so ours only joins it.
      path.append(folder)
      _record_hidden(name, losers=[folder], winners=list(path)[:-1])
    return None
  try:
    spec = importlib.util.find_spec(name)  # Top-level: searches, imports nothing.
  except (ImportError, ValueError):
    spec = None
  theirs = list(spec.submodule_search_locations or []) if spec is not None else []
  if spec is not None and spec.origin is not None and any(_same(p, folder) for p in theirs):
    return None  # Ours is what `import name` finds; import it when it is needed.
  theirs = [p for p in theirs if not _same(p, folder)]
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder, *theirs])
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise
  _record_hidden(name, losers=theirs, winners=[folder])
  return module


def _children(folder: str) -> dict[str, str]:
  """Module name -> file or folder, for the modules and packages directly in `folder`."""
  children = {}
  try:
    entries = sorted(os.listdir(folder))
  except OSError:
    return children
  for entry in entries:
    path = os.path.join(folder, entry)
    if entry.endswith(".py") and entry != "__init__.py":
      children[entry[:-3]] = path
    elif os.path.isfile(os.path.join(path, "__init__.py")):
      children[entry] = path
  return children


def _record_hidden(name: str, losers: Sequence[str], winners: Sequence[str]) -> None:
  won = {}
  for folder in reversed(winners):  # The first folder on __path__ wins.
    won.update(_children(folder))
  for folder in losers:
    for child, path in _children(folder).items():
      if child in won:
        _hidden[f"{name}.{child}"] = (f"{path} is not importable: {won[child]} takes its name "
                                      "(the first folder on the package path wins); "
                                      "rename one of them")
