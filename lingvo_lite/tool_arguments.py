"""The argument parser of the bin/ tools, under the executor's contract: a mistake is one line
and exit code 2, and a flag given empty is refused rather than read as left out.

argparse prints its usage and exits 2 on a mistake, and takes `--task=` (what `--task=$UNSET`
gives) as the value '' that a tool would then read as no `--task` at all. The tools catch the
UsageError this parser raises and print it as their one line.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from lingvo_lite.errors import EMPTY_VALUE, UsageError


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
    return parsed
