"""The command line as absl parses it, with the config overrides kept in command-line order.

absl accepts many spellings of a flag (`--f=v`, `--f v`, `-f=v`, a line of a `--flagfile`), but a
multi-flag keeps only its own values, and the order of `--fiddler`, `--fdl_set` and `--fdl.PATH=V`
relative to each other is lost. Overrides must apply in the order the user gave them, so each
override flag is an `OverrideFlag` whose `parse()` (absl calls it once per occurrence, in order,
after expanding flag files) appends to one shared `OverrideLog`. Whatever absl accepts therefore
takes effect in order, and whatever it refuses is its one-line error: nothing is scanned out of
argv behind absl's back, so no spelling can be silently dropped.

`--fdl.PATH=VALUE` is Fiddle's spelling, and no flag name absl could know in advance. After
the flag files are expanded, each such argument is rewritten to the flag `--fdl_dot=PATH=VALUE`
(messages and config.txt still show `--fdl.PATH=VALUE`).

What absl lets vanish in silence is refused here in one line: flag files are expanded as absl
would, but an empty `--flagfile=` and a flag file that includes itself are errors; a flag whose
empty value could only mean "not given" (a name, a path) parses with `NonEmptyParser`.
"""

from __future__ import annotations

import os
from typing import Sequence

from absl import flags

from lingvo_lite import input_files
from lingvo_lite.config import overrides
from lingvo_lite.errors import EMPTY_VALUE, UsageError

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


# absl gives `--flag=` (what `--flag=$UNSET` is) the value '', which a program reading the flag
# cannot tell from the flag left out: errors.EMPTY_VALUE says so.


class NonEmptyParser(flags.ArgumentParser):
  """A string flag's parser that refuses an empty (or blank) value, in absl's one line."""

  def parse(self, argument):
    if isinstance(argument, str) and not argument.strip():
      raise ValueError(EMPTY_VALUE)
    return argument


class NonEmptyListParser(flags.ListParser):
  """A comma-separated list flag's parser that refuses an empty value or an empty item."""

  def parse(self, argument):
    if isinstance(argument, str) and not argument.strip():
      raise ValueError(EMPTY_VALUE)
    values = super().parse(argument)
    for index, value in enumerate(values, 1):
      if not value:
        raise ValueError(f"item {index} is empty; give the items comma-separated, without "
                         "empty ones")
    return values


def _split(arg: str) -> tuple[int, str, bool, str]:
  """(dashes, name, has '=', value) of one argument, as absl splits it."""
  dashes = 2 if arg.startswith("--") else 1 if arg.startswith("-") else 0
  name, equals, value = arg[dashes:].partition("=")
  return dashes, name, bool(equals), value


def expand(argv: Sequence[str], flag_values: flags.FlagValues) -> list[str]:
  """argv with flag files expanded and `--fdl.PATH=V` as `--fdl_dot=PATH=V`.

  `--fdl.PATH VALUE` (absl's space-separated form) is rewritten too. Arguments after `--` and
  the value of a preceding `--flag VALUE` are left as they are.

  Raises:
    UsageError: a flag file that cannot be used (see `expand_flagfiles`), or `--fdl.PATH` with
      no value.
  """
  args = [*argv[:1], *expand_flagfiles(argv[1:])]
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


# Far more than any list of flags; a larger "flag file" is some other file (or an endless
# pipe: `--flagfile=<(yes)`).
MAX_FLAGFILE_BYTES = 1 << 20
_FLAGFILE_FIX = "name a text file of flags, one per line"


def expand_flagfiles(args: Sequence[str]) -> list[str]:
  """`args` (argv without the program) with each `--flagfile=FILE` replaced by FILE's flags.

  absl's own expansion, with its spellings and its file format (`--flagfile=F`, `-flagfile=F`,
  `--flagfile F`; in a file, one flag per line, blank lines and lines starting with `#` or `//`
  skipped, `--flagfile=F` lines expanded in place), except that what absl passes over in
  silence is refused: an empty name (`--flagfile=$UNSET`), which absl ignores, and a file that
  includes itself, which absl skips with a warning. Nothing after `--` is expanded.

  Raises:
    UsageError: one line naming the `--flagfile` (and the file and line that gave it, for a
      nested one): no value, an empty name, a file that cannot be read (missing, a folder, no
      permission), is not UTF-8 or is too large, a loop of includes.
  """
  expanded: list[str] = []
  i = 0
  while i < len(args):
    arg = args[i]
    if arg == "--":
      expanded.extend(args[i:])
      break
    if arg in ("--flagfile", "-flagfile"):
      if i + 1 >= len(args):
        raise UsageError(f"{arg}: missing value; write {arg}=FILE ({_FLAGFILE_FIX})")
      expanded.extend(_flagfile_lines(args[i + 1], f"{arg}={args[i + 1]}", []))
      i += 2
      continue
    if arg.startswith(("--flagfile=", "-flagfile=")):
      expanded.extend(_flagfile_lines(arg.partition("=")[2], arg, []))
    else:
      expanded.append(arg)
    i += 1
  return expanded


def _flagfile_lines(name: str, written: str, including: list[str]) -> list[str]:
  """The flags of the flag file `name`, its own `--flagfile=` lines expanded.

  Args:
    name: The file as written (absl strips the spaces around it and expands `~`).
    written: The directive as the user wrote it, for messages (`--flagfile=f.txt`; for a
      nested one, where it is: `--flagfile=outer.txt line 3: --flagfile=f.txt`).
    including: The real paths of the files that include this one, outermost first.
  """
  name = name.strip()
  if not name:
    raise UsageError(f"{written}: empty file name (an unset shell variable gives one); "
                     f"{_FLAGFILE_FIX}, or drop the flag")
  path = os.path.expanduser(name)
  # A loop is found by real paths (`./a.txt` including `a.txt` is one), but the file is opened
  # by its name: /dev/fd/N (`--flagfile=<(...)` in bash) resolves to no path that opens.
  real = os.path.realpath(path)
  if real in including:
    loop = " -> ".join([*including[including.index(real):], real])
    raise UsageError(f"{written}: the flag file includes itself ({loop}); remove the "
                     "--flagfile line that closes the loop")
  try:
    # A pipe being written (`<(...)`) is read to its end; a FIFO nobody writes to, a device
    # (/dev/zero, a terminal) or a socket is refused rather than waited on.
    data = input_files.read_bytes(path, written, _FLAGFILE_FIX, limit=MAX_FLAGFILE_BYTES,
                                  stream=True)
  except OSError as e:
    raise UsageError(f"{written}: cannot read the flag file ({e.strerror or e}); "
                     f"{_FLAGFILE_FIX}") from None
  if len(data) > MAX_FLAGFILE_BYTES:
    raise UsageError(f"{written}: more than {MAX_FLAGFILE_BYTES >> 20} MiB, not a flag file; "
                     f"{_FLAGFILE_FIX}")
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise UsageError(f"{written}: not UTF-8 text ({e.reason}: byte "
                     f"{e.object[e.start:e.start + 1]!r} at position {e.start}); save it "
                     "as UTF-8") from None
  found: list[str] = []
  # Lines as a file read in text mode has them (absl's), not str.splitlines()'s, which would
  # also split a value at a form feed or U+2028.
  lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
  for number, line in enumerate(lines, 1):
    if not line.strip() or line.startswith(("#", "//")):
      continue
    if line.startswith(("--flagfile=", "-flagfile=")):
      nested = line.partition("=")[2]
      found.extend(_flagfile_lines(nested, f"{written} line {number}: {line.strip()}",
                                   [*including, real]))
    elif line.strip() in ("--flagfile", "-flagfile") or line.startswith(("--flagfile ",
                                                                          "-flagfile ")):
      # absl would pass it on as an unknown flag, or take the next argument as the file.
      raise UsageError(f"{written} line {number}: {line.strip()}: write --flagfile=FILE on "
                       "one line, without a space")
    else:
      found.append(line.strip())
  return found


def help_requested(args: Sequence[str]) -> str | None:
  """"short", "full" or "xml" when `args` (expanded) ask for help, else None."""
  for arg in args[1:]:
    if arg == "--":
      return None
    dashes, name, has_value, value = _split(arg)
    if dashes and name in HELP_FLAGS and (not has_value or value.lower() in ("true", "1")):
      return HELP_FLAGS[name]
  return None
