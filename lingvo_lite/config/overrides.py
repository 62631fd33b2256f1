"""Command-line config overrides: `--fiddler=NAME`, `--fdl.a.b=VALUE`, `--fdl_set=a.b=VALUE`.

Fiddle's legacy flags apply every fiddler before every set, whatever the command line
says. Here the directives are applied in command-line order (command_line.py collects them
as absl parses the flags).
A VALUE is a Python literal (`ast.literal_eval`, never evaluated as code) and is checked
against the field's type annotation before it is set, so a typo or a wrong type fails
with one line naming the flag, the value and the fix. Each change is recorded in the
config's history with the flag that made it, which `config.txt` shows.

A PATH walks from the root config: `.name` is a field of a config (`model.num_layers`),
`[index]` an element of a list or tuple (`train_data.sources[0].split`), and a dict entry is
reached by its key, in any of three equivalent spellings:

  --fdl.eval_data.held_out.num_batches=8        # A key that is a Python identifier.
  --fdl.eval_data['held_out'].num_batches=8     # Any string key, in quotes.
  --fdl.eval_data["held out"].num_batches=8

A shell takes the quotes off an unquoted `['held_out']`; the `[held_out]` it passes on reads
the same (a key with other characters needs the whole flag in quotes). Messages and config.txt
write a path the first way where they can, the second otherwise. A key must already be in the
dict (a typo is refused with the keys there are); a whole entry (`--fdl.eval_data.held_out=3`)
is checked against the dict's annotation (`Mapping[str, DataSource]`: a DataSource), so a part
inside a dict is changed field by field, like any other.

Longer than 300 lines with a reason: the directives are applied in command-line order by one
function, `apply`, and what it needs (walking a path, parsing a value and checking it against the
field's annotation, finding a fiddler) is a few short functions each.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib
import inspect
import re
import types
from typing import Any, Callable, Sequence

import fiddle as fdl
from fiddle import history

from lingvo_lite import fields
from lingvo_lite.config import checks as config_checks, fiddlers as generic_fiddlers
from lingvo_lite.config import former_objectives
from lingvo_lite.runtime import user_code
from lingvo_lite.errors import SHOWN_LIMIT, UsageError, shown


@dataclasses.dataclass(frozen=True)
class Directive:
  """One override in command-line order: a fiddler name, or a path and value text."""

  kind: str  # "fiddler" or "set"
  flag: str  # The argument as the user wrote it, for messages and history.
  name: str = ""  # Fiddler name.
  path: str = ""  # The field path of a set, as written (see the module doc).
  value_text: str = ""


def _partition(assignment: str) -> tuple[str, str, str]:
  """`PATH=VALUE` split at the first `=` outside a quoted key (`eval_data['a=b'].x=1`)."""
  quote, position = "", 0
  while position < len(assignment):
    char = assignment[position]
    if quote:
      if char == "\\":
        position += 1  # An escaped character, maybe the quote itself.
      elif char == quote:
        quote = ""
    elif char in "'\"" and assignment[position - 1:position] == "[":
      quote = char
    elif char == "=":
      return assignment[:position], "=", assignment[position + 1:]
    position += 1
  # An unclosed quote: the first `=` is the best guess, and the path's parse names the problem.
  return assignment.partition("=")


def set_directive(flag: str, assignment: str) -> Directive:
  """A `set` directive from `PATH=VALUE`; `flag` is how the user wrote it, for messages."""
  path, equals, value_text = _partition(assignment)
  if not equals or not path:
    raise UsageError(f"{flag}: expected PATH=VALUE, e.g. --fdl.model.num_layers=2 or "
                     "--fdl_set=model.num_layers=2")
  return Directive("set", flag, path=path.strip(), value_text=value_text)


# Far longer than any literal a config holds (the whole default rules table is 300
# characters): Python's parser needs stack and memory in proportion to the text, and a
# message echoes it.
MAX_VALUE_LENGTH = 10_000


def parse_value(directive: Directive) -> Any:
  """The literal a VALUE text denotes; a bare word gets a hint showing the quoting."""
  text = directive.value_text
  if len(text) > MAX_VALUE_LENGTH:
    flag = directive.flag[:len(directive.flag) - len(text)]  # Without the value.
    raise UsageError(f"{flag}...: the value is {len(text)} characters long, more than the "
                     f"{MAX_VALUE_LENGTH} a field's value may have; set large values in a "
                     "fiddler (--fiddler=module.function)")
  try:
    return ast.literal_eval(text)
  # TypeError: an unhashable key (`{[1]: 2}`); RecursionError and MemoryError: nesting deeper
  # than Python's parser goes (`--1` with 5000 minus signs).
  except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
    hint = ""
    if re.fullmatch(r"[A-Za-z_][\w\-./]*", text.strip()):
      hint = f"; a string needs quotes inside the shell's: --fdl.{directive.path}='\"{text}\"'"
    # The flag already shows a long value; the message need not repeat it.
    subject = repr(text) if len(repr(text)) <= SHOWN_LIMIT else "the value"
    raise UsageError(f"{directive.flag}: {subject} is not a Python literal (numbers, quoted "
                     f"strings, True/False/None, tuples, lists, dicts){hint}") from None


# ----------------------------------------------------------------------------- types


def _check_value(directive: Directive, path: str, value: Any, annotation: Any) -> None:
  """The type, then the declared constraints (a positive size, a finite float, ...).

  `path` is the field's, spelled as messages spell it (the flag shows how the user did).
  """
  if fields.matches(value, annotation) is False:
    fix = ""
    if fields.is_part(annotation):
      fix = (f"; a part is changed field by field (--fdl.{path}.FIELD=VALUE), or replaced by "
             "a config in a fiddler")
    raise UsageError(f"{directive.flag}: {path} must be {fields.describe(annotation)}, "
                     f"got {type(value).__name__} {shown(value)}{fix}")
  problem = fields.value_problem(value, annotation)
  if problem:
    # The flag shows the path and the value as written (`--fdl.train.steps=-5`).
    raise UsageError(f"{directive.flag}: {problem}")


# ----------------------------------------------------------------------------- paths

_NAME = re.compile(r"[A-Za-z_]\w*")
# `[3]`, a quoted key with Python's escapes (`['held out']`, `["it's"]`), or a name: a shell
# takes the quotes off an unquoted `--fdl.eval_data['held_out'].x=1`.
_BRACKET = re.compile(
    r"""\[(?:(\d+)|([A-Za-z_]\w*)|('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"))\]""")


def _split_path(directive: Directive) -> list[str | int]:
  """The steps of a path: field names and string keys as str, indices as int."""
  steps: list[str | int] = []
  path, position = directive.path, 0
  while position < len(path):
    if steps and path.startswith(".", position):
      match = _NAME.match(path, position + 1)
    else:
      match = (None if steps else _NAME.match(path, position)) or _BRACKET.match(path, position)
    step = _step(match)
    if step is None:
      raise UsageError(f"{directive.flag}: cannot parse the field path {shown(path)}; use "
                       "dotted names, [index] or ['key'], e.g. model.num_layers or "
                       "eval_data['held_out'].num_batches")
    steps.append(step)
    position = match.end()
  return steps


def _step(match: re.Match[str] | None) -> str | int | None:
  """The step a `_NAME` or `_BRACKET` match denotes; None for no match or a bad literal."""
  if match is None:
    return None
  if match.re is _NAME:
    return match.group(0)
  if match.group(1):
    return int(match.group(1))
  if match.group(2):
    return match.group(2)
  try:
    return ast.literal_eval(match.group(3))
  except (ValueError, SyntaxError):
    return None  # A bad escape (`['\\x']`).


def _parameter_names(buildable: fdl.Buildable) -> list[str]:
  return list(inspect.signature(fdl.get_callable(buildable)).parameters)


def _child(parent: Any, step: str | int, walked: str, annotation: Any,
           directive: Directive) -> tuple[Any, Any]:
  """(parent's field or entry `step`, its annotation or None); `annotation` is parent's."""
  if isinstance(parent, dict):
    _check_key(parent, step, walked, directive)
    return parent[step], fields.entry_annotation(annotation, parent, step)
  if isinstance(step, int):
    if not isinstance(parent, (list, tuple)) or step >= len(parent):
      raise UsageError(f"{directive.flag}: {walked or 'the root'} has no element [{step}]")
    return parent[step], fields.entry_annotation(annotation, parent, step)
  if isinstance(parent, fdl.Buildable):
    _check_parameter(parent, step, walked, directive)
    hints = fields.type_hints(fdl.get_callable(parent))
    if step in config_checks.unset_required(parent):
      # Fiddle has no value to hand back for a required field that is not set.
      path = fields.path_join(walked, step)
      raise UsageError(f"{directive.flag}: {path} is not set (required by "
                       f"{fdl.get_callable(parent).__name__}), so it has no fields to set; "
                       f"{config_checks.how_to_set(path, hints.get(step))}")
    return getattr(parent, step), hints.get(step)
  kind = "None" if parent is None else f"a {type(parent).__name__}"
  raise UsageError(f"{directive.flag}: {walked} is {kind}, not a config with fields; "
                   f"it has no field {step!r}")


def _check_key(container: dict[Any, Any], key: str | int, walked: str,
               directive: Directive) -> None:
  if key in container:
    return
  names = [k for k in container if isinstance(k, str)]
  close = difflib.get_close_matches(key, names, n=1) if isinstance(key, str) else []
  if close:
    fix = f"did you mean {close[0]!r}?"
  elif container:
    fix = f"its entries: {', '.join(sorted(fields.key_text(k) for k in container))}"
  else:
    fix = "it has none"
  raise UsageError(f"{directive.flag}: {walked} has no entry {key!r}; {fix}")


def _check_parameter(buildable: fdl.Buildable, name: str, walked: str,
                     directive: Directive) -> None:
  names = _parameter_names(buildable)
  if name in names:
    return
  owner = fdl.get_callable(buildable).__name__
  close = difflib.get_close_matches(name, names, n=1)
  fix = f"did you mean {close[0]!r}?" if close else f"valid fields: {', '.join(names)}"
  where = f"{walked}." if walked else ""
  raise UsageError(f"{directive.flag}: {owner} ({walked or 'root'}) has no field "
                   f"{where}{name}; {fix}")


def set_field(cfg: fdl.Buildable, directive: Directive) -> None:
  """Applies one `path=value` directive, checking the field (or dict entry) exists and the
  type fits."""
  steps = _split_path(directive)
  value = parse_value(directive)
  former = former_objectives.refusal(steps, value) if former_objectives.holds_train_loop(
      cfg) else None
  if former:  # `train.objective='dpo'`, `train.dpo.beta`: spelled as before objectives were parts.
    raise UsageError(f"{directive.flag}: {former}")
  parent, walked, annotation = cfg, "", None
  holder = None  # (config, field) of the field that holds `parent` when it is a container.
  for step in steps[:-1]:
    child, annotation = _child(parent, step, walked, annotation, directive)
    if isinstance(parent, fdl.Buildable):
      holder = (parent, step)
    parent, walked = child, fields.path_join(walked, step)
  last = steps[-1]
  path = fields.path_join(walked, last)
  if isinstance(parent, dict):
    _check_key(parent, last, walked, directive)
    annotation = fields.entry_annotation(annotation, parent, last)
    if annotation is not None:
      _check_value(directive, path, value, annotation)
    parent[last] = value
    # Fiddle records history per field of a config, not per entry of a dict: setting the
    # field that holds the dict again labels it with this flag in config.txt.
    owner, name = holder
    setattr(owner, name, getattr(owner, name))
    return
  if isinstance(last, int):
    raise UsageError(f"{directive.flag}: set a whole field, not one element of it")
  if not isinstance(parent, fdl.Buildable):
    _child(parent, last, walked, annotation, directive)  # Raises with the right message.
  _check_parameter(parent, last, walked, directive)
  annotation = fields.type_hints(fdl.get_callable(parent)).get(last)
  if annotation is not None:
    _check_value(directive, path, value, annotation)
  setattr(parent, last, value)


# ----------------------------------------------------------------------------- fiddlers


def _is_fiddler(fn: Any) -> bool:
  """Fiddlers are functions of exactly one parameter named `cfg`."""
  try:
    return list(inspect.signature(fn).parameters) == ["cfg"]
  except (TypeError, ValueError):
    return False


def fiddlers_for(experiment: type | None) -> dict[str, Callable[..., Any]]:
  """Fiddlers by name, in lookup order: experiment class, its module, generic ones."""
  found: dict[str, Callable[..., Any]] = {}
  modules: list[types.ModuleType] = []
  if experiment is not None:
    for klass in experiment.__mro__:
      for name, attribute in vars(klass).items():
        if isinstance(attribute, staticmethod) and _is_fiddler(attribute.__func__):
          found.setdefault(name, attribute.__func__)
    modules.append(importlib.import_module(experiment.__module__))
  modules.append(generic_fiddlers)
  for module in modules:
    for name, fn in vars(module).items():
      if (inspect.isfunction(fn) and fn.__module__ == module.__name__
          and not name.startswith("_") and _is_fiddler(fn)):
        found.setdefault(name, fn)
  return found


def _check_fiddler(fn: Any, flag: str) -> None:
  """A fiddler named by import path is a Python function of one argument, and not one that
  the standard library, an installed distribution or lingvo_lite wrote for another purpose.

  The same guard as for `--exp` import paths (`user_code.foreign_code`): calling
  `sys.exit`, `builtins.input` or `shutil.rmtree` with the config would end the run, wait for
  a terminal or delete files. A library's function shaped as a fiddler (one parameter named
  `cfg`) is one it wrote for `--fiddler`.
  """
  fix = "a fiddler is a Python function of one argument, the config: def my_fiddler(cfg): ..."
  function = fn.__func__ if inspect.ismethod(fn) else fn
  if not inspect.isfunction(function):
    raise UsageError(f"{flag}: is {user_code.kind(fn)}, not a fiddler; {fix}")
  foreign = user_code.foreign_code(function)
  if foreign and (user_code.code_owner(function) == "stdlib" or not _is_fiddler(fn)):
    raise UsageError(f"{flag}: {foreign}, not a fiddler; {fix}")
  try:
    inspect.signature(fn).bind(None)
  except TypeError:
    raise UsageError(f"{flag}: {function.__module__}.{function.__qualname__}"
                     f"{inspect.signature(fn)} does not take one argument; {fix}") from None
  except ValueError:
    pass  # No signature to check; the call will say.


def find_fiddler(name: str, experiment: type | None, flag: str) -> Callable[..., Any]:
  """The fiddler a `--fiddler=NAME` names: one of `fiddlers_for(experiment)`, or an import path.

  Raises:
    UsageError: no such fiddler, a module on the path that fails to import, or an import path
      to something that is not a fiddler.
  """
  candidates = fiddlers_for(experiment)
  if name in candidates:
    return candidates[name]
  valid = (f"valid choices: {', '.join(sorted(candidates))} (or an import path "
           "module.function)")
  note = ""
  if "." in name:
    if not all(part.isidentifier() for part in name.split(".")):
      raise UsageError(f"{flag}: {shown(name)} is neither a fiddler name nor a dotted import "
                       f"path; {valid}")
    module_name, _, attribute = name.rpartition(".")
    try:
      module = user_code.import_module(module_name)
    except user_code.ImportFailed as e:
      raise UsageError(f"{flag}: importing module {module_name} failed: {e}") from None
    fn = getattr(module, attribute, None) if module is not None else None
    if fn is not None:
      _check_fiddler(fn, flag)
      return fn
    note = (f" (no module named {module_name!r})" if module is None
            else f" ({module_name} has no attribute {attribute!r})")
  raise UsageError(f"{flag}: no fiddler named {shown(name)}{note}; {valid}")


def apply(cfg: fdl.Buildable, directives: Sequence[Directive], experiment: type | None) -> None:
  """Applies the directives in order, labelling each change in the config's history.

  Raises:
    UsageError: one line for a directive that fails: an unknown fiddler or field, a bad
      value, or a fiddler that raised (named with the exception and the line that raised it).
  """
  for position, directive in enumerate(directives):
    location = history.Location(filename="command line", line_number=position + 1,
                                function_name=directive.flag)
    with history.custom_location(lambda location=location: location):
      if directive.kind == "fiddler":
        fiddler = find_fiddler(directive.name, experiment, directive.flag)
        try:
          fiddler(cfg)
        except UsageError as e:
          raise UsageError(f"{directive.flag}: {e}") from None
        # Any exception, and SystemExit: a fiddler is the user's code run on the user's
        # config, so its failure is a config mistake to report in one line, like a failing
        # config() (registry.config_from_flag), not a traceback or a silent exit.
        except (Exception, SystemExit) as e:  # pylint: disable=broad-except
          unset = config_checks.unset_required(cfg) if isinstance(e, AttributeError) else []
          if unset:  # Fiddle's message about it quotes the whole config, over many lines.
            root = fdl.get_callable(cfg)
            fix = config_checks.how_to_set(unset[0], fields.type_hints(root).get(unset[0]))
            raise UsageError(f"{directive.flag}: the fiddler raised AttributeError on a config "
                             f"that does not set {', '.join(unset)} (required by "
                             f"{root.__name__}); {fix}") from None
          raise UsageError(f"{directive.flag}: the fiddler raised "
                           f"{user_code.describe(e)}") from None
      else:
        set_field(cfg, directive)
