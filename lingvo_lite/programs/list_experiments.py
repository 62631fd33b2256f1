"""The list program: every registered experiment with its first doc line."""

from __future__ import annotations

import inspect
import sys

from lingvo_lite.config import registry
from lingvo_lite.programs import Invocation


def main(invocation: Invocation) -> None:
  """A module that failed to import is one warning line each; the rest are still listed."""
  del invocation
  for name, cls in registry.all_experiments().items():
    doc = (inspect.getdoc(cls) or "").splitlines()
    print(f"{name:<40} {doc[0] if doc else ''}")
  for module, reason in registry.import_failures().items():
    print(f"lingvo_lite: warning: skipped {module}: {reason}", file=sys.stderr)
