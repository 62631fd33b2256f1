"""How a program declares its command-line options: a frozen dataclass, one field per flag.

A program module defines `Options`, a frozen dataclass whose every field is one flag of the
same name, declared with `option(default, doc)` and typed by its annotation:

  bool / int / float / str, each optionally `| None`     --name=VALUE
  Literal["a", "b", ...]                                 one of the choices
  list[str] | None                                       comma-separated: --name=a,b

`option(..., non_empty=True)` marks a name, path or list whose empty value (`--name=`, what an
unset shell variable gives) could only mean "not given": it is refused in one line instead.
`option(..., repeated=True)` marks a `list[str]` flag given once per value
(`--prompt=a --prompt=b`).

The executor, the only module that defines flags, defines one flag per declared option and
hands each program its `Options` filled from the parsed command line (`Invocation.options`);
a flag no option of the chosen program declares is refused. Two programs may declare the same
option (eval and decode read `checkpoint_step`): it is one flag, so their declarations must
agree, which `declared_options` checks.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Iterable, Literal

from lingvo_lite.weights import formats

# Where `option` keeps what the annotation cannot say, in the field's metadata.
_HELP, _NON_EMPTY, _REPEATED = "help", "non_empty", "repeated"

# The kinds of flag an option becomes (what absl's DEFINE_* function each one takes).
BOOL, INTEGER, FLOAT, STRING, ENUM, LIST, MULTI_STRING = (
    "bool", "integer", "float", "string", "enum", "list", "multi_string")
_SCALARS = {bool: BOOL, int: INTEGER, float: FLOAT, str: STRING}


def option(default: Any, doc: str, *, non_empty: bool = False, repeated: bool = False) -> Any:
  """One field of an `Options` dataclass: its flag's default and its --help text.

  Args:
    default: The value when the flag is not given (a list default is copied per instance).
    doc: The flag's help text, as --help shows it.
    non_empty: Refuse an empty value (a string) or an empty item (a list).
    repeated: A `list[str]` given as one flag per value, not comma-separated.
  """
  metadata = {_HELP: doc, _NON_EMPTY: non_empty, _REPEATED: repeated}
  if isinstance(default, list):
    return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class NoOptions:
  """The options of a program that reads no flag of its own (list)."""


@dataclasses.dataclass(frozen=True)
class DeclaredOption:
  """One option as its flag is defined.

  Attributes:
    name: The flag's name (the field's).
    kind: BOOL, INTEGER, FLOAT, STRING, ENUM, LIST or MULTI_STRING.
    default: Its default.
    help: Its help text.
    choices: An ENUM's values, in declaration order.
    non_empty: Empty values are refused (STRING, LIST).
  """

  name: str
  kind: str
  default: Any
  help: str
  choices: tuple[str, ...] = ()
  non_empty: bool = False


def _without_none(annotation: Any) -> Any:
  """`X | None` (or Optional[X]) -> X; anything else as it is."""
  if typing.get_origin(annotation) in (typing.Union, types.UnionType):
    kept = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(kept) == 1:
      return kept[0]
  return annotation


def _declared(options_class: type, field: dataclasses.Field, annotation: Any) -> DeclaredOption:
  where = f"{options_class.__module__}.{options_class.__qualname__}.{field.name}"
  if _HELP not in field.metadata:
    raise TypeError(f"{where}: declare it with programs.options.option(default, doc)")
  default = (field.default_factory() if field.default is dataclasses.MISSING
             else field.default)
  annotation = _without_none(annotation)
  common = {"name": field.name, "default": default, "help": field.metadata[_HELP]}
  if typing.get_origin(annotation) is Literal:
    return DeclaredOption(kind=ENUM, choices=tuple(typing.get_args(annotation)), **common)
  if typing.get_origin(annotation) is list and typing.get_args(annotation) == (str,):
    if field.metadata[_REPEATED]:
      return DeclaredOption(kind=MULTI_STRING, **common)
    return DeclaredOption(kind=LIST, non_empty=field.metadata[_NON_EMPTY], **common)
  if annotation in _SCALARS:
    return DeclaredOption(kind=_SCALARS[annotation],
                          non_empty=field.metadata[_NON_EMPTY] and annotation is str, **common)
  raise TypeError(f"{where}: type {annotation!r} has no flag kind; use bool, int, float, str, "
                  "Literal[...] or list[str]")


def declared(options_class: type) -> list[DeclaredOption]:
  """The options `options_class` (a frozen dataclass) declares, in field order."""
  hints = typing.get_type_hints(options_class)
  return [_declared(options_class, field, hints[field.name])
          for field in dataclasses.fields(options_class)]


def declared_options(options_classes: Iterable[type]) -> list[DeclaredOption]:
  """Every option of `options_classes`, each name once.

  Raises:
    TypeError: two classes declare one name differently (kind, default, help, choices): a
      flag has one definition, so a program that reads another's flag declares it alike.
  """
  found: dict[str, DeclaredOption] = {}
  for options_class in options_classes:
    for declaration in declared(options_class):
      earlier = found.setdefault(declaration.name, declaration)
      if earlier != declaration:
        raise TypeError(f"--{declaration.name}: declared differently by "
                        f"{options_class.__module__}.{options_class.__qualname__} ({declaration}) "
                        f"and before ({earlier}); one flag has one declaration")
  return list(found.values())


def checkpoint_step_option() -> Any:
  """`--checkpoint_step`, one declaration for every program that reads one checkpoint (eval,
  decode, serve, export), which `declared_options` requires to be alike."""
  return option(None, "--mode=eval / decode / serve / export: use this checkpoint step "
                "(default: the latest).")


def init_from_option() -> Any:
  """`--init_from`, one declaration for every program that starts from a weight source (train,
  eval, decode, serve, export, and compile and print, which show its model): an Options class
  declaring it gets `config_parts` from weights/sources.py. What it takes is the weight
  formats' table's (weights/formats.py)."""
  return option(
      None, "--mode=train / eval / decode / serve / export / compile / print: "
      f"{formats.init_from_help()}; sets train.init_from. Training starts there with a fresh "
      "optimizer; a job with checkpoints uses its own.",
      non_empty=True)
