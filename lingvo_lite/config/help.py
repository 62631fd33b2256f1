"""`--fdl_help`: every field of a config with its type, value, origin and doc, and its fiddlers.

The docs come from where the fields are declared: the `Attributes:` (or `Args:`) section of
the configured class's or function's Google-style docstring, so there is no second copy of
them to keep up to date. A config held in a dict, list or tuple is listed under the path that
reaches it (`eval_data.held_out: DataSource = <...>`), its fields below it.
"""

from __future__ import annotations

import inspect
import re
import typing
from typing import Any, Callable, Mapping

import fiddle as fdl

from lingvo_lite import fields
from lingvo_lite.config import files as config_files

_SECTION = re.compile(r"^(\s*)(Attributes|Args|Arguments):\s*$")
_ENTRY = re.compile(r"^(\s*)([A-Za-z_][\w, ]*?)(?:\s*\([^)]*\))?:\s*(.*)$")


def field_docs(fn: Callable[..., Any]) -> dict[str, str]:
  """Field name -> its one-paragraph doc, from the docstring's Attributes/Args section.

  One entry may document several fields at once (`b1, b2, eps: ...`). A class's fields are
  documented where they are declared: a subclass that only changes defaults (a model family
  built on a shared transformer) gets its base classes' docs of the fields it leaves out.
  """
  docs: dict[str, str] = {}
  classes = [c for c in inspect.getmro(fn) if c is not object] if inspect.isclass(fn) else [fn]
  for source in (*classes, getattr(fn, "__init__", None)):
    for name, doc in _documented(source).items():
      docs.setdefault(name, doc)
  return docs


def _documented(source: Any) -> dict[str, str]:
  """The Attributes/Args entries of one object's own docstring."""
  docs: dict[str, str] = {}
  text = (source.__doc__ if inspect.isclass(source) else inspect.getdoc(source)) \
      if source is not None else None
  if not text:
    return docs
  lines = inspect.cleandoc(text).splitlines()
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


def _annotation(fn: Callable[..., Any], name: str) -> Any:
  """The annotation of a field of `fn`, without `Annotated` extras; None when there is none."""
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
      return None
  return annotation


def _type_name(annotation: Any) -> str:
  if annotation is None:
    return "?"
  if isinstance(annotation, type):
    return annotation.__name__
  return str(annotation).replace("typing.", "")


def describe(cfg: fdl.Buildable, fiddlers: Mapping[str, Callable[..., Any]]) -> str:
  """The text `--fdl_help` prints."""
  lines = ["Fields (set with --fdl.PATH=VALUE; VALUE is a Python literal):", ""]
  # The annotation of the field holding each container, for the type of its entries.
  containers: dict[int, Any] = {}
  for row in config_files.rows(cfg):
    doc = ""
    if isinstance(row.owner, fdl.Buildable):
      fn = fdl.get_callable(row.owner)
      annotation = _annotation(fn, row.key)
      doc = field_docs(fn).get(row.key, "")
    else:
      holder = containers.get(id(row.owner))
      annotation = (None if holder is None
                    else fields.entry_annotation(holder, row.owner, row.key))
    if isinstance(row.value, (dict, list, tuple)) and annotation is not None:
      containers[id(row.value)] = annotation
    lines.append(f"  {row.path}: {_type_name(annotation)} = {row.text}    # {row.origin}")
    if doc:
      lines.append(f"      {doc}")
  lines += ["", "Fiddlers (apply with --fiddler=NAME, in command-line order with the sets):", ""]
  for name, fn in sorted(fiddlers.items()):
    doc = (inspect.getdoc(fn) or "").splitlines()
    lines.append(f"  {name}: {doc[0] if doc else ''}")
  return "\n".join(lines) + "\n"
