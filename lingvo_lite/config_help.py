"""`--fdl_help`: every field of a config with its type, value, origin and doc, and its fiddlers.

The docs come from where the fields are declared: the `Attributes:` (or `Args:`) section of
the configured class's or function's Google-style docstring, so there is no second copy of
them to keep up to date.
"""

from __future__ import annotations

import inspect
import re
import typing
from typing import Any, Callable, Mapping

import fiddle as fdl

from lingvo_lite import config_files

_SECTION = re.compile(r"^(\s*)(Attributes|Args|Arguments):\s*$")
_ENTRY = re.compile(r"^(\s*)([A-Za-z_][\w, ]*?)(?:\s*\([^)]*\))?:\s*(.*)$")


def field_docs(fn: Callable[..., Any]) -> dict[str, str]:
  """Field name -> its one-paragraph doc, from the docstring's Attributes/Args section.

  One entry may document several fields at once (`b1, b2, eps: ...`).
  """
  docs: dict[str, str] = {}
  for source in (fn, getattr(fn, "__init__", None)):
    text = inspect.getdoc(source) if source is not None else None
    if not text:
      continue
    lines = text.splitlines()
    section_indent = None
    entry_indent = None
    names: list[str] = []
    for line in lines:
      match = _SECTION.match(line)
      if match:
        section_indent, entry_indent, names = len(match.group(1)), None, []
        continue
      if section_indent is None:
        continue
      if line.strip() and len(line) - len(line.lstrip()) <= section_indent:
        section_indent = None  # The section ended.
        continue
      entry = _ENTRY.match(line)
      indent = len(line) - len(line.lstrip())
      if entry and (entry_indent is None or indent == entry_indent):
        entry_indent = indent
        names = [n.strip() for n in entry.group(2).split(",") if n.strip()]
        for name in names:
          docs.setdefault(name, entry.group(3).strip())
      elif line.strip() and names:
        for name in names:
          docs[name] = f"{docs[name]} {line.strip()}".strip()
  return docs


def _type_name(fn: Callable[..., Any], name: str) -> str:
  target = fn.__init__ if inspect.isclass(fn) and not hasattr(fn, "__dataclass_fields__") \
      else fn
  try:
    annotation = typing.get_type_hints(target).get(name)
  except Exception:  # pylint: disable=broad-except
    annotation = None  # Unresolvable annotations: show none rather than fail the help.
  if annotation is None:
    parameter = inspect.signature(fn).parameters.get(name)
    annotation = parameter.annotation if parameter is not None else inspect.Parameter.empty
    if annotation is inspect.Parameter.empty:
      return "?"
  if isinstance(annotation, type):
    return annotation.__name__
  return str(annotation).replace("typing.", "")


def _buildables(cfg: fdl.Buildable, prefix: str = "") -> dict[str, fdl.Buildable]:
  """Dotted path ('' for the root) -> every Buildable in the config tree."""
  found = {prefix.rstrip("."): cfg}
  for name, value in fdl.ordered_arguments(cfg, include_defaults=True).items():
    if isinstance(value, fdl.Buildable):
      found.update(_buildables(value, f"{prefix}{name}."))
  return found


def describe(cfg: fdl.Buildable, fiddlers: Mapping[str, Callable[..., Any]]) -> str:
  """The text `--fdl_help` prints."""
  parts = _buildables(cfg)
  lines = ["Fields (set with --fdl.PATH=VALUE; VALUE is a Python literal):", ""]
  for path, value_text, origin in config_files.flatten(cfg):
    parent_path, _, name = path.rpartition(".")
    fn = fdl.get_callable(parts[parent_path])
    doc = field_docs(fn).get(name, "")
    lines.append(f"  {path}: {_type_name(fn, name)} = {value_text}    # {origin}")
    if doc:
      lines.append(f"      {doc}")
  lines += ["", "Fiddlers (apply with --fiddler=NAME, in command-line order with the sets):", ""]
  for name, fn in sorted(fiddlers.items()):
    doc = (inspect.getdoc(fn) or "").splitlines()
    lines.append(f"  {name}: {doc[0] if doc else ''}")
  return "\n".join(lines) + "\n"
