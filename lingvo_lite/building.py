"""From a config to a validated Setup: `fdl.build`, then `Setup.validate()`.

Every program gets its Setup from here, so a config that would fail is refused, with one
line naming the field, before any device time is spent.
"""

from __future__ import annotations

import fiddle as fdl

from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup


def build(cfg: fdl.Buildable) -> Setup:
  """fdl.build + validate, with construction errors reported as one line with the path."""
  try:
    setup = fdl.build(cfg)
  except Exception as e:  # pylint: disable=broad-except
    message = str(e).strip()
    summary = message.splitlines()[0] if message else type(e).__name__
    path = ""
    if " at <root>" in message:
      path = message.split(" at <root>", 1)[1].split()[0].lstrip(".") + ": "
    raise UsageError(f"{path}{summary} (while building the config)") from None
  if not isinstance(setup, Setup):
    raise UsageError(f"the config builds a {type(setup).__name__}, not a lingvo_lite Setup")
  setup.validate()
  return setup
