"""The print program: the config after overrides, once it has validated, in `--format`'s form.

  text  config.txt's listing: every field, flattened, with where its value came from
  json  config.json's text, which `--fdl_config_file` reloads
  svg   a picture of the config's parts and the fields they set (lingvo_lite.config.graph)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from lingvo_lite.programs import Invocation
from lingvo_lite.programs.options import init_from_option, option
from lingvo_lite.weights import sources


@dataclasses.dataclass(frozen=True)
class Options:
  """The flags of --mode=print."""

  format: Literal["text", "json", "svg"] = option(
      "text", "--mode=print: what to print: text (config.txt: every field, flattened, with its "
      "origin), json (config.json: reloadable by --fdl_config_file) or svg (a picture of the "
      "config's parts and the fields set; needs Graphviz's dot).")
  init_from: str | None = init_from_option()

  def config_parts(self, cfg: Any) -> dict[str, Any]:
    """A weight source's `model` (and `train.init_from`) from --init_from: the config a
    Hugging Face folder or GGUF file describes, with its fields' origin (weights/sources.py)."""
    return sources.config_parts(self.init_from, cfg)


def main(invocation: Invocation) -> None:
  shown = {"text": invocation.config_text, "json": invocation.config_json,
           "svg": invocation.config_svg}[invocation.options.format]()
  print(shown, end="" if shown.endswith("\n") else "\n")
