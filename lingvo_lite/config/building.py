"""From a config to a validated Setup: type checks, `fdl.build`, then `Setup.validate()`.

Every program gets its Setup from here, so a config that would fail is refused, with one
line naming the field, before any device time is spent. A constructor that rejects a value
raises `UsageError` naming its own field (`source_dir=...: no such folder`); the config path
of that constructor, which Fiddle appends to the exception, is put in front of it. Any other
exception from a constructor is a bug, not the user's mistake: it keeps its traceback.
"""

from __future__ import annotations

import re
from typing import Any

import fiddle as fdl

from lingvo_lite.config import checks as config_checks
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup

# What fiddle 0.3 appends to an exception raised by the constructor at a config path.
_FIDDLE_CONTEXT = re.compile(r"\n\nFiddle context: failed to construct or call .*? at "
                             r"<root>(\S*) with ", re.DOTALL)
# The start of a `config_error` message: `field=value: ...`.
_FIELD_FIRST = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*|\[\d+\])*=")


def set_parts(cfg: fdl.Buildable, parts: dict[str, Any]) -> None:
  """Sets each `{dotted path: part}` in `cfg` (`train.init_from`, `model`): what a program's
  options stand for (--init_from), set before the fiddlers and --fdl overrides."""
  for path, part in parts.items():
    *owners, name = path.split(".")
    owner = cfg
    for step in owners:
      owner = getattr(owner, step)
    setattr(owner, name, part)


def build(cfg: fdl.Buildable) -> Setup:
  """Checks, builds and validates `cfg`.

  Raises:
    UsageError: one line naming the config path, for a value the type checks, a
      constructor or `Setup.validate()` refuses.
  """
  config_checks.check(cfg)
  try:
    setup = fdl.build(cfg)
  except UsageError as e:
    raise UsageError(_with_config_path(e)) from None
  if not isinstance(setup, Setup):
    raise UsageError(f"the config builds a {type(setup).__name__}, not a lingvo_lite Setup")
  setup.validate()
  return setup


def _with_config_path(error: UsageError) -> str:
  """The constructor's own message, led by the config path of the failing constructor."""
  message = str(getattr(error, "proxy_base_exception", error)).strip()
  context = _FIDDLE_CONTEXT.search(str(error))
  # Fiddle writes a mapping's entry as ['key']: the dotted spelling is the one users type.
  path = re.sub(r"\['([A-Za-z_]\w*)'\]", r".\1", context.group(1)).lstrip(".") if context else ""
  if not path:
    return message
  return f"{path}.{message}" if _FIELD_FIRST.match(message) else f"{path}: {message}"
