"""The argument parser of the bin/ tools and how they end, under the executor's contract: a
mistake is one line and exit code 2, bad data or a failed write one line and 1, Ctrl-C 130;
and a flag given empty is refused rather than read as left out (`ended`: the exit codes).

argparse prints its usage and exits 2 on a mistake, and takes `--task=` (what `--task=$UNSET`
gives) as the value '' that a tool would then read as no `--task` at all. The tools catch the
UsageError this parser raises and print it as their one line.
"""

from __future__ import annotations

import argparse
from typing import Callable, NoReturn

from lingvo_lite.errors import EMPTY_VALUE, DataError, UsageError, os_error_text


class ToolArgumentParser(argparse.ArgumentParser):
  """argparse whose mistakes are UsageErrors (one line, exit 2) and that refuses empty values."""

  def error(self, message: str) -> NoReturn:
    raise UsageError(f"{message} (see --help)")

  def parse_args(self, args=None, namespace=None):
    parsed = super().parse_args(args, namespace)
    for name, value in vars(parsed).items():
      for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str) and not item.strip():
          self.error(f"--{name}={item}: {EMPTY_VALUE}")
        if isinstance(item, str) and "\0" in item:
          # No path or name a tool passes on can hold one: every os call raises ValueError.
          self.error(f"--{name}={item}: holds a NUL character (\\x00), which no file or "
                     "split name can hold; give the value without it")
    return parsed

  def refuse_unread(self, parsed: argparse.Namespace, mode: str,
                    readers: dict[str, tuple[str, ...]]) -> None:
    """Refuses a flag given (its value not its default) that `mode` does not read, as the
    executor refuses a flag its --mode does not read: ignored, it would look obeyed.

    Args:
      parsed: What `parse_args` returned.
      mode: What the command does (`--task=code`, `--check`), as the message names it.
      readers: Each mode-specific flag's name -> the modes that read it.
    """
    for name, modes in readers.items():
      if mode not in modes and getattr(parsed, name) != self.get_default(name):
        self.error(f"--{name}: {mode} does not read it (only {' and '.join(modes)} "
                   f"{'does' if len(modes) == 1 else 'do'}); drop the flag")


def ended(run: Callable[[], int], print_error: Callable[[str], None], interrupted: str,
          write_again: str = "") -> int:
  """`run()`'s exit code, or the one its error ends the tool with, the error printed as its
  one line: a UsageError 2, a DataError 1, an OSError 1 (a write failed: its cause and the fix,
  then `write_again`, e.g. ", then build again"), Ctrl-C 130 (`interrupted` says what is
  left)."""
  try:
    return run()
  except UsageError as e:
    print_error(str(e))
    return 2
  except DataError as e:
    print_error(str(e))
    return 1
  except OSError as e:
    problem, fix = os_error_text(e, "give --out on another disk")
    where = f" {e.filename}" if e.filename else ""
    print_error(f"cannot write{where}: {problem}; {fix}{write_again}")
    return 1
  except KeyboardInterrupt:
    print_error(interrupted)
    return 130

