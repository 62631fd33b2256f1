"""The command line as absl parses it, with the config overrides kept in command-line order.

absl accepts many spellings of a flag (`--f=v`, `--f v`, `-f=v`, a line of a `--flagfile`), but a
multi-flag keeps only its own values, and the order of `--fiddler`, `--fdl_set` and `--fdl.PATH=V`
relative to each other is lost. Overrides must apply in the order the user gave them, so each
override flag is an `OverrideFlag` whose `parse()` (absl calls it once per occurrence, in order,
after expanding flag files) appends to one shared `OverrideLog`. Whatever absl accepts therefore
takes effect in order, and whatever it refuses is its one-line error: nothing is scanned out of
argv behind absl's back, so no spelling can be silently dropped.

`--fdl.PATH=VALUE` is Fiddle's spelling, and no flag name absl could know in advance. After
absl has expanded the flag files, each such argument is rewritten to the flag `--fdl_dot=PATH=VALUE`
(messages and config.txt still show `--fdl.PATH=VALUE`).
"""

from __future__ import annotations

from typing import Sequence

from absl import flags

from lingvo_lite import overrides
from lingvo_lite.errors import UsageError

DOTTED_FLAG = "fdl_dot"
HELP_FLAGS = {"help": "short", "helpshort": "short", "?": "short", "h": "short",
              "helpfull": "full", "helpxml": "xml"}


class OverrideLog:
  """The override directives of one command line, in the order absl parsed them."""

  def __init__(self):
    self.directives: list[overrides.Directive] = []

  def clear(self) -> None:
    self.directives.clear()


class OverrideFlag(flags.MultiFlag):
  """A repeatable string flag whose every occurrence is also appended to a shared log.

  Args:
    name: The flag's name.
    kind: "fiddler" or "set".
    spelling: How messages show one occurrence, with `{}` for its value
      (`--fiddler={}`, `--fdl.{}`).
    log: The log shared by every override flag.
    help_string: absl's help text.
  """

  def __init__(self, name: str, kind: str, spelling: str, log: OverrideLog, help_string: str):
    super().__init__(flags.ArgumentParser(), flags.ArgumentSerializer(), name, [], help_string)
    self._kind = kind
    self._spelling = spelling
    self._log = log

  def parse(self, arguments):  # pylint: disable=arguments-renamed
    super().parse(arguments)
    for value in self._parse(arguments):
      written = self._spelling.format(value)
      if self._kind == "fiddler":
        self._log.directives.append(overrides.Directive("fiddler", written, name=value))
      else:
        self._log.directives.append(overrides.set_directive(written, value))

  def unparse(self) -> None:
    super().unparse()
    self._log.clear()


def _split(arg: str) -> tuple[int, str, bool, str]:
  """(dashes, name, has '=', value) of one argument, as absl splits it."""
  dashes = 2 if arg.startswith("--") else 1 if arg.startswith("-") else 0
  name, equals, value = arg[dashes:].partition("=")
  return dashes, name, bool(equals), value


def expand(argv: Sequence[str], flag_values: flags.FlagValues) -> list[str]:
  """argv with flag files expanded (as absl would) and `--fdl.PATH=V` as `--fdl_dot=PATH=V`.

  `--fdl.PATH VALUE` (absl's space-separated form) is rewritten too. Arguments after `--` and
  the value of a preceding `--flag VALUE` are left as they are.

  Raises:
    UsageError: a flag file that cannot be read or is not UTF-8, or `--fdl.PATH` with no
      value.
  """
  try:
    args = flag_values.read_flags_from_files(list(argv), force_gnu=False)
  except flags.Error as e:
    raise UsageError(str(e).splitlines()[0]) from None
  except UnicodeDecodeError as e:
    # absl reads flag files as text and its error names no file: find the one that is not.
    name = _undecodable_flagfile(argv[1:], set()) or "FILE"
    raise UsageError(f"--flagfile={name}: not UTF-8 text ({e.reason}: byte "
                     f"{e.object[e.start:e.start + 1]!r} at position {e.start}); save it "
                     "as UTF-8") from None
  expanded, i = args[:1], 1
  while i < len(args):
    arg = args[i]
    if arg == "--":
      expanded.extend(args[i:])
      break
    dashes, name, has_value, value = _split(arg)
    if dashes and name.startswith("fdl."):
      if not has_value:
        # `--fdl.a.b --next_flag`: no literal starts with "--", so the value was left out.
        if i + 1 >= len(args) or args[i + 1].startswith("--"):
          raise UsageError(f"{arg}: missing value; write --fdl.PATH=VALUE, e.g. "
                           "--fdl.model.num_layers=2")
        value = args[i + 1]
        i += 1
      expanded.append(f"--{DOTTED_FLAG}={name[len('fdl.'):]}={value}")
    elif dashes and not has_value and name in flag_values and not flag_values[name].boolean:
      expanded.extend(args[i:i + 2])  # `--flag VALUE`: the value is not itself a flag.
      i += 1
    else:
      expanded.append(arg)
    i += 1
  return expanded


def _flagfile_names(args: Sequence[str]) -> list[str]:
  """The files `--flagfile=F` / `--flagfile F` (any number of dashes) name, in order."""
  names = []
  for i, arg in enumerate(args):
    if arg == "--":
      break
    dashes, name, has_value, value = _split(arg)
    if dashes and name == "flagfile":
      if has_value:
        names.append(value)
      elif i + 1 < len(args):
        names.append(args[i + 1])
  return names


def _undecodable_flagfile(args: Sequence[str], seen: set[str]) -> str | None:
  """The first flag file named in `args`, or in a flag file they name, that is not UTF-8."""
  for name in _flagfile_names(args):
    if name in seen:
      continue  # absl skips a circular include too.
    seen.add(name)
    try:
      with open(name, "rb") as f:
        text = f.read().decode("utf-8")
    except UnicodeDecodeError:
      return name
    except OSError:
      continue
    found = _undecodable_flagfile([line.strip() for line in text.splitlines()], seen)
    if found:
      return found
  return None


def help_requested(args: Sequence[str]) -> str | None:
  """"short", "full" or "xml" when `args` (expanded) ask for help, else None."""
  for arg in args[1:]:
    if arg == "--":
      return None
    dashes, name, has_value, value = _split(arg)
    if dashes and name in HELP_FLAGS and (not has_value or value.lower() in ("true", "1")):
      return HELP_FLAGS[name]
  return None
