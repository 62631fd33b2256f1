"""The stdlib instruction set's measures for one function (tasks/lm_eval/stdlib_chat.yaml):
whether the code written parses (and is not empty), and whether it is the library's own function up to
formatting and comments (equal `ast.dump`s). Nothing is executed."""

from __future__ import annotations

import ast
import textwrap


def _tree(code: str) -> str | None:
  """The code's syntax tree as text; None where it does not parse, or is empty."""
  if not code.strip():
    return None
  try:
    return ast.dump(ast.parse(textwrap.dedent(code)))
  except (SyntaxError, ValueError):
    return None


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
  written = _tree(results[0])
  return {"exact_match": float(written is not None and written == _tree(doc["source"])),
          "parses": float(written is not None)}
