"""The print program: the config after overrides, once it has validated, in `--format`'s form.

  text  config.txt's listing: every field, flattened, with where its value came from
  json  config.json's text, which `--fdl_config_file` reloads
  svg   a picture of the config's parts and the fields they set (lingvo_lite.config.graph)
"""

from __future__ import annotations

from lingvo_lite.programs import Invocation


def main(invocation: Invocation) -> None:
  form = invocation.options.get("format") or "text"
  shown = {"text": invocation.config_text, "json": invocation.config_json,
           "svg": invocation.config_svg}[form]()
  print(shown, end="" if shown.endswith("\n") else "\n")
