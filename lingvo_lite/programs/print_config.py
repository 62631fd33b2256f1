"""The print program: the flattened config after overrides, once it has validated."""

from __future__ import annotations

from lingvo_lite.programs import Invocation


def main(invocation: Invocation) -> None:
  print(invocation.config_text(), end="")
