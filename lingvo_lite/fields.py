"""What a field of a configurable part accepts: its type, and the constraints declared with it.

A part (a dataclass or Flax module that a config builds: the model, the optimizer, a data
source, ...) declares the range of a field next to the field, in its annotation:

  num_layers: PositiveInt                          # Annotated[int, Positive]
  b1: Annotated[float, Range(0, 1, high_open=True)]
  ici_data: Annotated[int, Range(1, also=(-1,), note="-1 takes the devices left over")]

and one generic check applies every declaration: to a `--fdl.` value when it is set, to
every argument of a config before it is built, and to every field of the built parts in
`Setup.validate()` (which also sees values set by fiddlers or read from a config.json).
Beyond the declarations, every float must be finite (`1e999` parses to inf) unless its
annotation carries `NonFinite`, and every int must fit int64, which is what JAX computes
shapes with. Nothing here imports Fiddle: models and data sources import this module to
declare their fields.

Longer than 300 lines with a reason: the declarations (`Range` and the annotated aliases), matching
a value against a type annotation, and the checks that apply both (`check`, `check_part`) are one
concept, what a field accepts, and every caller needs all three.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import numbers
import re
import types
import typing
from typing import Annotated, Any, Callable

from lingvo_lite.errors import UsageError, shown

_INT64_MAX = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class Range:
  """A number in [low, high] (ends open if asked), or one of the special values in `also`.

  Attributes:
    low: Smallest allowed value; None for no bound.
    high: Largest allowed value; None for no bound.
    low_open: Exclude `low` itself.
    high_open: Exclude `high` itself.
    also: Values allowed outside the range (e.g. -1 for "the rest").
    note: What the special values mean, or why the bound is there, for the message.
  """

  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_open: bool = False
  also: tuple[Any, ...] = ()
  note: str = ""

  def problem(self, value: Any) -> str | None:
    """Why `value` is outside the range ("must be ..."), or None if it is allowed."""
    if any(value == special for special in self.also):
      return None
    too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
    too_high = self.high is not None and (
        value >= self.high if self.high_open else value > self.high)
    if not too_low and not too_high:
      return None
    return "must be " + self.requirement(isinstance(value, numbers.Integral))

  def requirement(self, integer: bool) -> str:
    """The range in words: 'a positive integer', '>= 0', 'in [0, 1)', ..."""
    low_is_positive = ((self.low == 0 and self.low_open)
                       or (integer and self.low == 1 and not self.low_open))
    if low_is_positive and self.high is None:
      text = f"a positive {'integer' if integer else 'number'}"
    elif self.high is None:
      text = f"{'>' if self.low_open else '>='} {_number(self.low)}"
    elif self.low is None:
      text = f"{'<' if self.high_open else '<='} {_number(self.high)}"
    else:
      text = (f"in {'(' if self.low_open else '['}{_number(self.low)}, {_number(self.high)}"
              f"{')' if self.high_open else ']'}")
    if self.also:
      text += " or " + " or ".join(repr(v) for v in self.also)
    return f"{text} ({self.note})" if self.note else text


def _number(x: float) -> str:
  return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclasses.dataclass(frozen=True)
class _NonFinite:
  """Marks a float field that may hold inf or nan (every other float must be finite)."""


NonFinite = _NonFinite()


@dataclasses.dataclass(frozen=True)
class NonEmpty:
  """Marks a string field that must hold something: an empty or blank value (what an unset
  shell variable gives) is refused as empty, with `fix`, never as a malformed value."""

  fix: str
Positive = Range(low=0, low_open=True)
NonNegative = Range(low=0)
Int32Size = Range(low=1, high=2**31 - 1, note="token ids and positions are int32")

PositiveInt = Annotated[int, Positive]
NonNegativeInt = Annotated[int, NonNegative]
PositiveFloat = Annotated[float, Positive]
NonNegativeFloat = Annotated[float, NonNegative]


# ----------------------------------------------------------------------------- paths

# A key spelled with a dot in a path; Setup.validate() holds eval set names to the same rule.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def path_join(path: str, step: Any) -> str:
  """`path` extended by a field name, a mapping's key or a sequence's index.

  Spelled the way `--fdl.` paths are written, so a message names what the user types: a
  field or an identifier key joins with a dot (`eval_data.held_out`), an index or any other
  key goes in brackets (`sources[0]`, `eval_data['held out']`).
  """
  if isinstance(step, str) and _NAME.fullmatch(step):
    return f"{path}.{step}" if path else step
  return f"{path}[{step!r}]"


def key_text(key: Any) -> str:
  """A key as a path step writes it, without the brackets: `held_out`, `'held out'`, `0`."""
  text = path_join("", key)
  return text[1:-1] if text.startswith("[") else text


def entries(container: Any) -> list[tuple[Any, Any]]:
  """(key or index, value) of a dict, list or tuple; [] for anything else."""
  if isinstance(container, dict):
    return list(container.items())
  if isinstance(container, (list, tuple)):
    return list(enumerate(container))
  return []


# ----------------------------------------------------------------------------- annotations


def type_hints(owner: Any) -> dict[str, Any]:
  """Field or parameter annotations of a class or function, with their `Annotated` extras.

  A class that is not a dataclass is described by its `__init__`. Annotations that do not
  resolve give {}: an unknown type is not checked rather than blocking the user.
  """
  target = owner
  if isinstance(owner, type) and not dataclasses.is_dataclass(owner):
    target = owner.__init__
  try:
    return typing.get_type_hints(target, include_extras=True)
  except Exception:  # pylint: disable=broad-except
    return {}


def _strip(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
  """(the annotation without `Annotated`, the extras it carried)."""
  if typing.get_origin(annotation) is Annotated:
    return annotation.__origin__, annotation.__metadata__
  return annotation, ()


def _union_args(annotation: Any) -> tuple[Any, ...] | None:
  if typing.get_origin(annotation) in (typing.Union, types.UnionType):
    return typing.get_args(annotation)
  return None


# `Mapping[str, X]`, `dict[str, X]` and their bare forms; typing.get_origin gives these.
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def entry_annotation(annotation: Any, container: Any, key: Any) -> Any:
  """The annotation of `container[key]`, from the annotation of the field holding `container`.

  `Mapping[str, DataSource]` gives DataSource for a dict, `tuple[int, str]` gives str for [1];
  in a union, the member that is that kind of container decides. None when the annotation
  declares no such container (then nothing is known of the entries).
  """
  annotation, _ = _strip(annotation)
  for member in _union_args(annotation) or (annotation,):
    member = _strip(member)[0]
    origin, args = typing.get_origin(member), typing.get_args(member)
    if isinstance(container, dict) and origin in _MAPPINGS:
      return args[1] if len(args) == 2 else None
    if isinstance(container, (list, tuple)) and origin in (list, tuple):
      if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        return args[key] if isinstance(key, int) and 0 <= key < len(args) else None
      return args[0] if args else None
  return None


def describe(annotation: Any) -> str:
  """An annotation in words: 'int', "one of 'a', 'b'", 'LanguageModel or None',
  'mapping of str to DataSource'."""
  annotation, _ = _strip(annotation)
  if annotation is type(None) or annotation is None:
    return "None"
  if typing.get_origin(annotation) is typing.Literal:
    return "one of " + ", ".join(repr(c) for c in typing.get_args(annotation))
  union = _union_args(annotation)
  if union is not None:
    return " or ".join(describe(arg) for arg in union)
  if typing.get_origin(annotation) in _MAPPINGS:
    kind = "dict" if typing.get_origin(annotation) is dict else "mapping"
    args = typing.get_args(annotation)
    if len(args) != 2:
      return kind
    key, value = (describe(a) if _union_args(_strip(a)[0]) is None else f"({describe(a)})"
                  for a in args)
    return f"{kind} of {key} to {value}"
  if isinstance(annotation, type):
    return annotation.__name__
  return str(annotation).replace("typing.", "")


def is_part(annotation: Any) -> bool:
  """Whether the annotation names a part (a class of the project's), not a plain value."""
  annotation, _ = _strip(annotation)
  union = _union_args(annotation)
  if union is not None:
    return any(is_part(arg) for arg in union)
  return isinstance(annotation, type) and annotation.__module__ not in ("builtins", "typing")


# ----------------------------------------------------------------------------- types


def _protocol_members(protocol: type) -> tuple[set[str], set[str]]:
  """(data members, methods) a Protocol declares."""
  data, methods = set(), set()
  for base in protocol.__mro__:
    if base in (object, typing.Protocol, typing.Generic):
      continue
    data |= set(getattr(base, "__annotations__", {}))
    methods |= {name for name, value in vars(base).items()
                if callable(value) and not name.startswith("_")}
  return data, methods


def _class_matches(value_type: type, annotation: type) -> bool | None:
  if getattr(annotation, "_is_protocol", False):
    data, methods = _protocol_members(annotation)
    if not all(callable(getattr(value_type, name, None)) for name in methods):
      return False
    declared = set(dir(value_type))
    for klass in value_type.__mro__:
      declared |= set(getattr(klass, "__annotations__", {}))
    # An attribute set in __init__ is invisible on the class: then it cannot be told.
    return True if data <= declared else None
  try:
    return issubclass(value_type, annotation)
  except TypeError:
    return None


def _all(results: list[bool | None]) -> bool | None:
  if any(r is False for r in results):
    return False
  return True if all(r is True for r in results) else None


def _items_match(value: Any, origin: Any, args: tuple[Any, ...],
                 type_of: Callable[[Any], type | None]) -> bool | None:
  """Whether the elements of a tuple, list or dict fit `tuple[int, ...]`, `dict[str, X]`..."""
  if not args or not isinstance(value, (tuple, list, collections.abc.Mapping)):
    return True if not args else None
  if origin in _MAPPINGS:
    return _all([matches(k, args[0], type_of) for k in value]
                + [matches(v, args[-1], type_of) for v in value.values()])
  if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
    if len(args) != len(value):
      return False
    return _all([matches(v, a, type_of) for v, a in zip(value, args)])
  return _all([matches(v, args[0], type_of) for v in value])


def matches(value: Any, annotation: Any,
            type_of: Callable[[Any], type | None] = type) -> bool | None:
  """Whether `value` fits `annotation`; None when that cannot be told.

  Args:
    value: The value, or something `type_of` knows the future type of (a Fiddle config).
    annotation: The field's annotation; `Annotated` extras are ignored here.
    type_of: The type `value` is or builds into; None for unknown.
  """
  annotation, _ = _strip(annotation)
  if annotation is Any:
    return True
  if annotation is None or annotation is type(None):
    return value is None
  origin = typing.get_origin(annotation)
  if origin is typing.Literal:
    return any(value == c and type(value) is type(c) for c in typing.get_args(annotation))
  union = _union_args(annotation)
  if union is not None:
    results = [matches(value, arg, type_of) for arg in union]
    if any(r is True for r in results):
      return True
    return None if any(r is None for r in results) else False
  value_type = type_of(value)
  if value_type is None:
    return None
  if origin in _MAPPINGS:
    if not issubclass(value_type, collections.abc.Mapping):
      return False
    return _items_match(value, origin, typing.get_args(annotation), type_of)
  if origin in (tuple, list):
    # A tuple and a list are interchangeable: a config.json gives back lists.
    if not issubclass(value_type, (tuple, list)):
      return False
    return _items_match(value, origin, typing.get_args(annotation), type_of)
  if annotation is float:
    return issubclass(value_type, numbers.Real) and not issubclass(value_type, bool)
  if annotation is int:
    return issubclass(value_type, numbers.Integral) and not issubclass(value_type, bool)
  if annotation in (tuple, list):
    return issubclass(value_type, (tuple, list))
  if isinstance(annotation, type):
    return _class_matches(value_type, annotation)
  return None


# ----------------------------------------------------------------------------- values


def _constraints(annotation: Any) -> tuple[list[Any], bool]:
  """(every Annotated extra anywhere in the annotation, whether None is allowed)."""
  annotation, extras = _strip(annotation)
  found, optional = list(extras), annotation is None or annotation is type(None)
  for arg in _union_args(annotation) or ():
    inner, inner_optional = _constraints(arg)
    found += inner
    optional = optional or inner_optional
  return found, optional


def value_problem(value: Any, annotation: Any) -> str | None:
  """Why a value of the right type is still refused ("must be ..."), or None.

  Checks the declared `Range`s, that a float is finite (unless `NonFinite`), that an int
  fits int64, and that a `NonEmpty` string is not blank.
  """
  if isinstance(value, str):
    empty = [c for c in _constraints(annotation)[0] if isinstance(c, NonEmpty)]
    return f"is empty; {empty[0].fix}" if empty and not value.strip() else None
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    return None
  constraints, optional = _constraints(annotation)
  or_none = " or None" if optional else ""
  if isinstance(value, numbers.Integral) and abs(int(value)) > _INT64_MAX:
    return "is past int64; no shape or count can be that large"
  if not isinstance(value, numbers.Integral) and not math.isfinite(value) and (
      NonFinite not in constraints):
    return f"must be a finite number{or_none}"
  for constraint in constraints:
    if isinstance(constraint, Range):
      problem = constraint.problem(value)
      if problem:
        return problem + or_none
  return None


def check(path: str, value: Any, annotation: Any,
          type_of: Callable[[Any], type | None] = type) -> None:
  """Raises the one-line error for a value that does not fit its field's annotation.

  An entry of a dict that does not fit is named by its own path (`eval_data.held_out=3:
  must be DataSource, ...`), the path a user types to change it; a list or tuple is named
  whole, as its elements are set together. `type_of` is as for `matches` (a container of
  Fiddle configs is checked before building).
  """
  bare = _strip(annotation)[0]
  fits = matches(value, annotation, type_of)
  if fits is not None and isinstance(value, dict):
    for key, entry in value.items():
      inner = entry_annotation(annotation, value, key)
      if inner is not None and (matches(entry, inner, type_of) is False
                                or value_problem(entry, inner)):
        check(path_join(path, key), entry, inner, type_of)
  if fits is False:
    if typing.get_origin(bare) is typing.Literal:
      problem = "valid choices: " + ", ".join(repr(c) for c in typing.get_args(bare))
    else:
      problem = f"must be {describe(annotation)}, got {type(value).__name__}"
    fix = ""
    if is_part(annotation) and not is_part(type(value)):
      fix = (f"a part is changed field by field ({path}.FIELD=VALUE), or replaced by a "
             "config in a fiddler")
    raise _error(path, value, problem, fix)
  problem = value_problem(value, annotation)
  if problem:
    raise _error(path, value, problem)


def _error(path: str, value: Any, problem: str, fix: str = "") -> UsageError:
  """`config_error`'s message, with a value of more than 80 characters shown by its type."""
  message = f"{path}={shown(value, limit=80)}: {problem}"
  return UsageError(message + (f"; {fix}" if fix else ""))


def _is_framework_field(part: Any, name: str) -> bool:
  """Flax modules' own `parent` and `name` fields are bookkeeping, not settings."""
  return name in ("parent", "name") and any(
      klass.__module__.startswith("flax.") for klass in type(part).__mro__)


def check_part(path: str, part: Any) -> None:
  """Checks every field of a dataclass part, and of the dataclass parts inside it, also those
  held in a dict, list or tuple (`eval_data.held_out.num_batches`, `train_data.sources[0]`).

  Raises:
    UsageError: naming `path.field`, the value and what it must be, for the first field
      that does not fit its annotation.
  """
  if isinstance(part, (dict, list, tuple)):
    for key, entry in entries(part):
      check_part(path_join(path, key), entry)
    return
  if not dataclasses.is_dataclass(part) or isinstance(part, type):
    return
  hints = type_hints(type(part))
  for field in dataclasses.fields(part):
    if _is_framework_field(part, field.name) or not hasattr(part, field.name):
      continue
    value = getattr(part, field.name)
    field_path = path_join(path, field.name)
    if field.name in hints:
      check(field_path, value, hints[field.name])
    check_part(field_path, value)

