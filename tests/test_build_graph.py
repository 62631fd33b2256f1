"""The Bazel graph, read from the BUILD.bazel files (nothing is built): `//lingvo_lite` is
everything in the framework.

A config.json may name any module of the framework by its import path (a data source, an
objective, a family), and loading it imports that module. Under Bazel a test sees only the
modules its deps reach, so a target that stands for "the framework" but misses one library
fails only when some old job's config names it, and only in CI's sandbox (outside Bazel every
module is on the path). Checking the graph here catches each such gap where it is made.
"""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMEWORK = "lingvo_lite:lingvo_lite"


def _label(package: str, text: str) -> str:
  """A dependency as "package:name" (`:x`, `//a/b:c` and `//a/b`, which means `//a/b:b`)."""
  if text.startswith(":"):
    return f"{package}:{text[1:]}"
  path = text.removeprefix("//")
  if ":" in path:
    return path
  return f"{path}:{path.rsplit('/', 1)[-1]}"


def _rules(package: str) -> dict[str, tuple[str, list[str], list[str]]]:
  """{label: (kind, srcs, deps)} of every rule call with a name in one BUILD.bazel."""
  with open(os.path.join(ROOT, package, "BUILD.bazel"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  # Lists the file names at its top (`EVALUATING_DEPS = [...]`), for `deps = NAME + [...]`.
  named = {node.targets[0].id: node.value for node in tree.body
           if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}

  def strings(value: ast.AST | None) -> list[str]:
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
      return strings(value.left) + strings(value.right)
    if isinstance(value, ast.Name):
      return strings(named.get(value.id))
    return [e.value for e in getattr(value, "elts", []) if isinstance(e, ast.Constant)]

  rules = {}
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
      continue
    fields = {k.arg: k.value for k in node.keywords if k.arg}
    if not isinstance(fields.get("name"), ast.Constant):
      continue
    lists = {key: strings(fields.get(key)) for key in ("srcs", "deps")}
    rules[f"{package}:{fields['name'].value}"] = (
        node.func.id, lists["srcs"], [_label(package, d) for d in lists["deps"]])
  return rules


def _framework_rules() -> dict[str, tuple[str, list[str], list[str]]]:
  rules = {}
  for folder, _, files in os.walk(os.path.join(ROOT, "lingvo_lite")):
    if "BUILD.bazel" in files and "__pycache__" not in folder:
      rules.update(_rules(os.path.relpath(folder, ROOT)))
  return rules


def _reached(rules: dict, start: str) -> set[str]:
  seen, todo = set(), [start]
  while todo:
    label = todo.pop()
    if label in seen or label not in rules:
      continue
    seen.add(label)
    todo += rules[label][2]
  return seen


def test_every_library_of_the_framework_is_in_its_target():
  rules = _framework_rules()
  assert FRAMEWORK in rules
  reached = _reached(rules, FRAMEWORK)
  missing = sorted(label for label, (kind, _, _) in rules.items()
                   if kind == "py_library" and label not in reached)
  assert not missing, ("//lingvo_lite (everything in the framework) does not reach these "
                       "libraries; add each to its package's aggregate target: "
                       + ", ".join(missing))


def test_every_module_of_the_framework_is_in_a_library():
  """Under Bazel the BUILD files are this test's data: a package left out of that list shows
  here as its modules in no rule."""
  rules = _framework_rules()
  # A source is a file of the rule's package, or a label of another's (`//a/b:c.py`).
  listed = {_label(label.split(":")[0], src).replace(":", "/") if src.startswith("//")
            else os.path.join(label.split(":")[0], src)
            for label, (_, srcs, _) in rules.items() for src in srcs}
  modules = {os.path.relpath(os.path.join(folder, name), ROOT)
             for folder, _, files in os.walk(os.path.join(ROOT, "lingvo_lite"))
             if "__pycache__" not in folder
             for name in files if re.fullmatch(r"[a-z_0-9]+\.py", name)}
  assert not sorted(modules - listed), f"modules in no BUILD rule: {sorted(modules - listed)}"



def _module_file(name: str) -> str | None:
  """The file of module `name` (a.b.c) under the root, or None if it is not one of ours."""
  path = os.path.join(ROOT, *name.split("."))
  for candidate in (path + ".py", os.path.join(path, "__init__.py")):
    if os.path.isfile(candidate):
      return os.path.relpath(candidate, ROOT)
  return None


def _imported_files(path: str) -> set[str]:
  """The framework's modules `path` imports, at the top or inside a function; not packages'
  `__init__.py` (their `package` targets are what every library lists first)."""
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return {file for name in names if name.split(".")[0] == "lingvo_lite"
          for file in [_module_file(name)]
          if file is not None and not file.endswith("__init__.py")}


def test_every_import_of_the_framework_is_in_its_librarys_deps():
  """A module's library reaches (through its deps) every framework module the module imports:
  outside Bazel every module is on the path, so a missing dep fails only in the sandbox, and
  only in a test whose other deps do not happen to bring the module along."""
  rules = _framework_rules()
  owner = {}
  for label, (_, srcs, _) in rules.items():
    for src in srcs:
      if not src.startswith("//"):
        owner[os.path.join(label.split(":")[0], src)] = label
  missing = []
  for path, label in sorted(owner.items()):
    reached = _reached(rules, label)
    for imported in sorted(_imported_files(path)):
      if imported in owner and owner[imported] not in reached:
        missing.append(f"{label} ({path}) imports {imported}: add {owner[imported]}")
  assert not missing, "libraries missing a dep:\n" + "\n".join(missing)
