"""The house rules the code keeps, read from the files (`ast`; nothing of the project is
imported): no module over 450 lines, no function over 60 lines, and no import that climbs a
floor of docs/DESIGN.md's "layers of the house" or closes a circle.

The floors are `FLOORS` below, module by module where a package spans two, and docs/DESIGN.md
draws the same picture: a test here keeps the two alike (each entry named on its floor there,
and nothing named there that the table puts elsewhere). A new module of a package that spans
two floors has no floor until it is given one here.

Tests count for the function rule (a 60-line test is as hard to read as a 60-line function);
bench/ does not (a benchmark's `main` is its script). The `duplicates` tool's pair count is
checked by hand, not here: the tool is not on CI.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import functools
import os
import re
from typing import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DESIGN = os.path.join(ROOT, "docs", "DESIGN.md")

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
# Whose modules the line rule covers, and the floors: the house. tests/ follow the function
# rule too.
HOUSE = ("lingvo_lite", "bin", "tasks", "experiments")
FUNCTION_RULE = HOUSE + ("tests",)
# Top-level folders named as they are; anything else is under lingvo_lite/.
_OUTSIDE_PACKAGE = ("bin/", "tasks/", "experiments/")

# The floors, top first: an import points to its own floor or one below. An entry is a folder
# (`serving/`: all of it, on one floor) or a module; a folder that spans two floors has no entry
# of its own, but one per module (and a new module there must be given its floor). Names are
# under lingvo_lite/, but for bin/, tasks/ and experiments/.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("face", ("bin/", "executor.py", "command_line.py", "tool_arguments.py", "__main__.py",
              "testing.py")),
    ("programs", ("programs/",)),
    ("serving", ("serving/", "harness/")),
    ("experiments", ("experiments/",)),
    ("edges", ("config/building.py", "config/builtin_packages.py", "config/checks.py",
               "config/diffs.py", "config/fiddlers.py", "config/files.py", "config/graph.py",
               "config/former_objectives.py", "config/help.py", "config/overrides.py",
               "config/registry.py", "report/")),
    ("running", ("on_mesh/", "decode/generator.py",
                 "decode/request_resolver.py", "decode/jitted.py", "decode/steps.py",
                 "decode/sampling.py", "decode/requests.py", "decode/records.py", "scoring/",
                 "memory_fit.py")),
    ("setup", ("experiment.py", "decode/settings.py")),
    ("parts", ("models/", "data/", "tasks/", "checkpoints/", "weights/", "training/", "rewards/",
               "partitioning.py", "mfu.py", "decode/__init__.py", "decode/sampling_checks.py")),
    ("runtime", ("runtime/", "target.py", "topologies.py", "chips.py")),
    ("ground", ("__init__.py", "errors.py", "fields.py", "run_fields.py", "paths.py", "outputs.py",
                "output_folders.py", "file_writes.py", "gguf_files.py", "input_files.py", "config/__init__.py",
                "config/moved_modules.py")),
)

def _path(entry: str) -> str:
  """A FLOORS entry as a path from the repository root."""
  return entry if entry.startswith(_OUTSIDE_PACKAGE) else "lingvo_lite/" + entry


@dataclasses.dataclass(frozen=True)
class Module:
  path: str  # From the repository root: lingvo_lite/decode/steps.py
  name: str  # As imported: lingvo_lite.decode.steps
  tree: ast.Module
  lines: int


def _python_files(top: str) -> Iterator[str]:
  for folder, subfolders, files in os.walk(os.path.join(ROOT, top)):
    subfolders[:] = sorted(s for s in subfolders if s != "__pycache__")
    for name in sorted(files):
      if name.endswith(".py"):
        yield os.path.relpath(os.path.join(folder, name), ROOT)


@functools.lru_cache(maxsize=None)
def _parsed(top: str) -> dict[str, Module]:
  found = {}
  for path in _python_files(top):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      text = f.read()
    name = path[:-len(".py")].replace(os.sep, ".").removesuffix(".__init__")
    found[name] = Module(path, name, ast.parse(text, path), len(text.splitlines()))
  return found


def modules(tops: tuple[str, ...]) -> dict[str, Module]:
  """Every Python file under `tops`, parsed, by import name."""
  return {name: module for top in tops for name, module in _parsed(top).items()}


def test_the_house_is_here():
  """The rules below read files: an empty or partial view of the tree would pass them."""
  found = modules(HOUSE)
  for name in ("lingvo_lite.executor", "lingvo_lite.programs", "lingvo_lite.models.family",
               "experiments", "tasks", "bin.main"):
    assert name in found, f"{name} is not among the files read from {ROOT}"
  assert os.path.isfile(DESIGN)


def _checked(breaches: dict[str, str], rule: str) -> None:
  """Fails on every breach of `rule` (what breaks it -> why), each on a line of its own."""
  found = [f"{what}: {why}" for what, why in sorted(breaches.items())]
  assert not found, f"{len(found)} breach(es) of the {rule} rule:\n  " + "\n  ".join(found)


# ----------------------------------------------------------------------------- sizes


def test_no_module_is_over_450_lines():
  breaches = {m.path: f"{m.lines} lines (at most {MAX_MODULE_LINES}: split it by "
              "concept, DESIGN rule 6)"
              for m in modules(HOUSE).values() if m.lines > MAX_MODULE_LINES}
  _checked(breaches, "lines")


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
  """(qualified name, node) of every function and method, nested ones too."""
  for node in ast.iter_child_nodes(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      yield prefix + node.name, node
      yield from _functions(node, f"{prefix}{node.name}.")
    elif isinstance(node, ast.ClassDef):
      yield from _functions(node, f"{prefix}{node.name}.")
    else:
      yield from _functions(node, prefix)


def test_no_function_is_over_60_lines():
  """From its `def` line to its last line (decorators apart), outside bench/."""
  breaches = {}
  for module in modules(FUNCTION_RULE).values():
    for name, node in _functions(module.tree):
      length = node.end_lineno - node.lineno + 1
      if length > MAX_FUNCTION_LINES:
        breaches[f"{module.path}::{name}"] = (
            f"{length} lines (at most {MAX_FUNCTION_LINES}: split it into named steps)")
  _checked(breaches, "function")


def test_the_rules_count_as_they_say():
  """The counting itself, on a module written here."""
  tree = ast.parse("class A:\n  def f(self):\n    def g():\n      pass\n\n    return g\n"
                   "async def h():\n  pass\n")
  lengths = {name: node.end_lineno - node.lineno + 1 for name, node in _functions(tree)}
  assert lengths == {"A.f": 5, "A.f.g": 2, "h": 2}


# ----------------------------------------------------------------------------- floors


def floor_table() -> dict[str, int]:
  """Path of each FLOORS entry -> its floor's number (0 is the top)."""
  table = {}
  for number, (_, entries) in enumerate(FLOORS):
    for entry in entries:
      assert _path(entry) not in table, f"FLOORS names {entry} twice"
      table[_path(entry)] = number
  return table


def floor_of(path: str, table: dict[str, int]) -> int | None:
  """The floor of the module at `path`: its own entry, else its folder's (the nearest)."""
  if path in table:
    return table[path]
  folder = os.path.dirname(path)
  while folder:
    if folder + "/" in table:
      return table[folder + "/"]
    folder = os.path.dirname(folder)
  return None


def test_each_floor_entry_is_one_place():
  """A folder's entry covers all of it: no entry of its own inside it (a folder that spans
  two floors lists its modules instead), and every entry names what is there."""
  table = floor_table()
  paths = {m.path for m in modules(HOUSE).values()}
  for entry in table:
    inside = [other for other in table if other != entry and other.startswith(entry)]
    assert not (entry.endswith("/") and inside), (
        f"FLOORS: {entry} is on one floor whole, yet {inside} have entries of their own; "
        "list the folder's modules instead")
    assert any(p == entry or p.startswith(entry) for p in paths), (
        f"FLOORS: {entry} names nothing under {ROOT}")


def _imported(module: Module, known: dict[str, Module]) -> Iterator[tuple[str, int]]:
  """(import name of a project module, line) for each import in `module`, wherever it is (a
  function's own imports are arrows too). `from P import x` is P.x where that is a module."""
  package = module.name if module.path.endswith("__init__.py") else module.name.rpartition(".")[0]
  for node in ast.walk(module.tree):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parent = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parent + ([node.module] if node.module else []))
      names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
      continue
    for name in names:
      while name and name not in known:  # `import a.b.c` of a module a.b with a name c...
        name = name.rpartition(".")[0]
      if name and name != module.name:
        yield name, node.lineno


def _project_name(name: str) -> bool:
  return name.split(".")[0] in HOUSE


@functools.lru_cache(maxsize=None)
def arrows() -> tuple[tuple[str, str, int], ...]:
  """(importer's path, imported's path, line) of every import between the house's modules."""
  known = modules(HOUSE)
  found = []
  for module in known.values():
    for name, line in _imported(module, known):
      found.append((module.path, known[name].path, line))
  return tuple(sorted(set(found)))


def test_every_project_import_is_read():
  """Each import of a project module names a file read here (under Bazel: in the test's
  runfiles), so nothing an import reaches is left out of the rules."""
  known = modules(HOUSE)
  missing = []
  for module in known.values():
    for node in ast.walk(module.tree):
      if isinstance(node, ast.ImportFrom) and not node.level and node.module and _project_name(
          node.module) and node.module not in known:
        missing.append(f"{module.path}:{node.lineno}: {node.module}")
      elif isinstance(node, ast.Import):
        missing += [f"{module.path}:{node.lineno}: {a.name}" for a in node.names
                    if _project_name(a.name) and a.name not in known]
  assert not missing, "imports of modules not read here:\n  " + "\n  ".join(missing)


def test_every_module_has_a_floor():
  table = floor_table()
  homeless = [m.path for m in modules(HOUSE).values() if floor_of(m.path, table) is None]
  assert not homeless, ("modules with no floor: give each one in tests/test_house.py's FLOORS "
                        "(and docs/DESIGN.md's layers):\n  " + "\n  ".join(homeless))


def test_no_import_climbs_a_floor():
  table = floor_table()
  names = [name for name, _ in FLOORS]
  breaches = {}
  for importer, imported, line in arrows():
    above, below = floor_of(importer, table), floor_of(imported, table)
    if above is not None and below is not None and below < above:
      breaches[f"{importer} -> {imported}"] = (
          f"line {line}: from the {names[above]} floor up to the {names[below]} floor")
  _checked(breaches, "climb")


def _room(path: str, table: dict[str, int]) -> tuple[str, int]:
  """A room: a top-level folder's modules on one floor (lingvo_lite/'s own modules are a room
  each)."""
  parts = path.split("/")
  if parts[0] == "lingvo_lite" and len(parts) > 2:
    top = "lingvo_lite/" + parts[1] + "/"
  elif parts[0] == "lingvo_lite":
    top = path
  else:
    top = parts[0] + "/"
  return top, floor_of(path, table)


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected parts of more than one node (Tarjan's, iterative)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []
  for start in sorted(edges):
    if start in index:
      continue
    work = [(start, iter(sorted(edges[start])))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = len(index)
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(edges.get(child, ())))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        part = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          part.append(member)
          if member == node:
            break
        if len(part) > 1:
          found.append(sorted(part))
  return found


def _one_circle(edges: dict[str, set[str]], part: list[str]) -> list[str]:
  """A shortest way around `part` (one of `_circles`), from its first node back to it."""
  start, inside = part[0], set(part)
  came_from, frontier = {start: None}, [start]
  while frontier:
    following = []
    for node in frontier:
      for child in sorted(edges.get(node, ())):
        if child == start:
          path = [node]
          while came_from[path[-1]] is not None:
            path.append(came_from[path[-1]])
          return [start, *reversed(path[:-1]), start]
        if child in inside and child not in came_from:
          came_from[child] = node
          following.append(child)
    frontier = following
  return part


def test_circles_are_found():
  edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert _circles(edges) == [["a", "b", "c"]]
  assert _one_circle(edges, ["a", "b", "c"]) == ["a", "b", "c", "a"]
  assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_modules_import_each_other_in_a_circle():
  edges = collections.defaultdict(set)
  for importer, imported, _ in arrows():
    edges[importer].add(imported)
  found = [" -> ".join(_one_circle(edges, part)) for part in _circles(edges)]
  assert not found, "import circles between modules:\n  " + "\n  ".join(found)


def test_the_rooms_of_a_floor_import_each_other_in_no_circle():
  """On one floor, a folder's modules are a room, and the rooms are in an order too: two that
  import each other (directly or around) would be one concept split in two, or one that
  belongs a floor higher (training/ importing checkpoints/ that imports training/)."""
  table = floor_table()
  names = [name for name, _ in FLOORS]

  def rooms(importer: str, imported: str) -> tuple[str, str] | None:
    """The two rooms an arrow joins, where they differ and are on one floor."""
    (a, floor), (b, other) = _room(importer, table), _room(imported, table)
    if a == b or floor != other or floor is None:
      return None
    return f"{a} ({names[floor]})", f"{b} ({names[floor]})"

  edges = collections.defaultdict(set)
  for importer, imported, _ in arrows():
    joined = rooms(importer, imported)
    if joined:
      edges[joined[0]].add(joined[1])
  found = _circles(edges)
  inside = {room for part in found for room in part}
  between = [f"{importer} -> {imported}" for importer, imported, _ in arrows()
             if set(rooms(importer, imported) or ("",)) <= inside]
  assert not found, (f"rooms of one floor that import each other around: {found}; the arrows "
                     "between them:\n  " + "\n  ".join(between))


# ----------------------------------------------------------------------------- DESIGN.md


def _design_floors() -> dict[str, str]:
  """docs/DESIGN.md's layers picture: each floor's name -> its text, with what is in
  parentheses (a room's own description) set apart as `(...)` so its names can be told from
  the rooms themselves."""
  with open(DESIGN, encoding="utf-8") as f:
    text = f.read()
  section = text.split("## The layers of the house", 1)[1]
  picture = section.split("```", 2)[1]
  names = [name for name, _ in FLOORS]
  floors, current = {}, None
  for line in picture.splitlines():
    first = re.match(r" (\w+)\s{2,}", line)
    if first and first.group(1) in names:
      current = first.group(1)
      line = line[first.end():]
    if current is not None:
      floors[current] = floors.get(current, "") + " " + line
  return floors


def _outside_parentheses(text: str) -> str:
  depth, kept = 0, []
  for char in text:
    depth += char == "("
    kept.append(char if depth == 0 else " ")
    depth -= char == ")" and depth > 0
  return "".join(kept)


_NAMED = re.compile(r"(?<![\w./])((?:\w+/)*(?:\w+\.py|\w+/))(?![\w/])")


def test_design_md_draws_the_floors_of_this_table():
  """Each FLOORS entry is named on its floor of docs/DESIGN.md's picture (a module of a folder
  that spans floors: the folder there, and the module's name within its description), and
  each folder or module the picture names outside a description is on that floor here."""
  drawn = _design_floors()
  names = [name for name, _ in FLOORS]
  assert list(drawn) == names, f"docs/DESIGN.md's floors {list(drawn)}; FLOORS has {names}"
  table = floor_table()
  problems = []
  for number, (floor, entries) in enumerate(FLOORS):
    text = drawn[floor]
    rooms = set(_NAMED.findall(_outside_parentheses(text)))
    for entry in entries:
      folder, _, module = entry.partition("/")
      if entry in rooms or entry.endswith("/__init__.py"):
        continue
      if not (module and folder + "/" in rooms and re.search(
          rf"\b{re.escape(module.removesuffix('.py'))}\b", text)):
        problems.append(f"{entry} is on the {floor} floor here, not there")
    for room in rooms:
      where = floor_of(_path(room), table) if not room.endswith("/") else None
      if room.endswith("/"):
        spanned = [p for p, n in table.items() if p.startswith(_path(room)) or p == _path(room)]
        where = number if any(table[p] == number for p in spanned) else (
            table[spanned[0]] if spanned else None)
      if where != number:
        problems.append(f"{room} is drawn on the {floor} floor, and is on "
                        f"{names[where] if where is not None else 'none'} here")
  assert not problems, "docs/DESIGN.md's layers and FLOORS differ:\n  " + "\n  ".join(problems)
