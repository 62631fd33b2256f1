"""Instruction and preference data made offline from the Python standard library: every
machine that runs Python has it, so post-training (chat SFT, DPO) has real data with nothing
to download.

Instructions (the chat format, tasks/formats/chat.py): each public top-level function of a
library file that has a docstring is one conversation: the user asks for a function of its
name and signature that does what its docstring says; the assistant answers with the
function's source, as the file has it, in a ```python block. The split is by file, as the
pycode task splits (`pycode.split_of`: a hash of the file's path), so no validation function
shares a file with a training one.

Preferences (the preference format, tasks/formats/preference.py), from the same functions: the
prompt is the same request, `chosen` the real function and `rejected` the same function with
one deliberate bug, both printed by `ast.unparse` so that they differ in the bug alone (never
in formatting or comments). The bug is the first of these the function allows, in its source
order: a comparison operator negated (`==` -> `!=`, `<` -> `>=`, `in` -> `not in`, `is` ->
`is not`, and back), `and` and `or` swapped, an integer constant moved by one, or a returned
value replaced by None. A function none of these apply to has no pair.

Functions longer than `max_chars` of source are left out, so a conversation fits a few hundred
tokens.
"""

from __future__ import annotations

import ast
import json
import os
from typing import Any, Iterator

from tasks import pycode

_NEGATED = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt,
            ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.In: ast.NotIn, ast.NotIn: ast.In,
            ast.Is: ast.IsNot, ast.IsNot: ast.Is}


def request(function: ast.FunctionDef, docstring: str) -> str:
  """The user's request for `function`: its name and arguments, and its docstring's words."""
  arguments = ast.unparse(function.args)
  return (f"Write a Python function `{function.name}({arguments})` that does the "
          f"following.\n\n{docstring.strip()}")


def answer(source: str) -> str:
  return f"```python\n{source.rstrip()}\n```"


def source_of_answer(text: str) -> str:
  """The code of an `answer` (its ```python block's contents)."""
  head = "```python\n"
  body = text[len(head):] if text.startswith(head) else text
  return body[:-len("\n```")] if body.endswith("\n```") else body


def functions(root: str, split: str, max_chars: int = 1500
              ) -> Iterator[tuple[str, ast.FunctionDef, str, str]]:
  """(file, function node, docstring, source) of each public top-level function with a
  docstring in `split`'s files, in file and source order."""
  for relative in pycode.source_files(root, split):
    path = os.path.join(root, relative)
    try:
      with open(path, encoding="utf-8") as f:
        text = f.read()
      module = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
      continue  # A library file this interpreter cannot parse (a lib2to3 fixture, say).
    for node in module.body:
      if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
        continue
      docstring = ast.get_docstring(node)
      source = ast.get_source_segment(text, node)
      if not docstring or len(docstring.strip()) < 20 or not source or len(source) > max_chars:
        continue
      yield relative, node, docstring, source


def _mutated(function: ast.FunctionDef) -> ast.FunctionDef | None:
  """A copy of `function` with one bug (see the module doc), or None."""
  copy = ast.parse(ast.unparse(function)).body[0]
  body = copy.body[1:] if ast.get_docstring(copy) else copy.body  # The docstring stays.
  nodes = [node for statement in body for node in ast.walk(statement)]
  for node in nodes:
    if isinstance(node, ast.Compare) and type(node.ops[0]) in _NEGATED:
      node.ops[0] = _NEGATED[type(node.ops[0])]()
      return copy
  for node in nodes:
    if isinstance(node, ast.BoolOp):
      node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
      return copy
  for node in nodes:
    if isinstance(node, ast.Constant) and type(node.value) is int:  # pylint: disable=unidiomatic-typecheck
      node.value += 1
      return copy
  for node in nodes:
    if isinstance(node, ast.Return) and node.value is not None and not (
        isinstance(node.value, ast.Constant) and node.value.value is None):
      node.value = ast.Constant(None)
      return copy
  return None


def instruction(function: ast.FunctionDef, docstring: str, source: str) -> dict[str, Any]:
  return {"messages": [{"role": "user", "content": request(function, docstring)},
                       {"role": "assistant", "content": answer(source)}]}


def preference(function: ast.FunctionDef, docstring: str) -> dict[str, Any] | None:
  wrong = _mutated(function)
  if wrong is None:
    return None
  return {"prompt": request(function, docstring), "chosen": answer(ast.unparse(function)),
          "rejected": answer(ast.unparse(wrong))}


def write(out: str, root: str | None = None, max_chars: int = 1500) -> dict[str, int]:
  """Writes `out/{instructions,preferences}/{train,validation}.jsonl`; returns the record
  count of each (`instructions/train`, ...)."""
  root = root or pycode.stdlib_dir()
  counts = {}
  for split in pycode.SPLITS:
    made: dict[str, list[str]] = {"instructions": [], "preferences": []}
    for _, node, docstring, source in functions(root, split, max_chars):
      made["instructions"].append(json.dumps(instruction(node, docstring, source)))
      pair = preference(node, docstring)
      if pair is not None:
        made["preferences"].append(json.dumps(pair))
    for kind, lines in made.items():
      os.makedirs(os.path.join(out, kind), exist_ok=True)
      with open(os.path.join(out, kind, f"{split}.jsonl"), "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
      counts[f"{kind}/{split}"] = len(lines)
  return counts


def data_folder(root: str | None = None, max_chars: int = 1500) -> str:
  """The folder `write` fills for this library and these settings, under the data root
  (`locations.data_root()/stdlib_chat/<key>`), written once per machine: into a temporary
  folder renamed into place, so a folder that exists is whole."""
  import hashlib  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  from lingvo_lite.data import locations  # pylint: disable=g-import-not-at-top
  root = os.path.abspath(root or pycode.stdlib_dir())
  key = hashlib.sha1(f"{root}|{sys.version}|{max_chars}|1".encode()).hexdigest()[:12]
  folder = os.path.join(os.fspath(locations.data_root()), "stdlib_chat", key)
  if not os.path.isdir(folder):
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    staging = tempfile.mkdtemp(dir=os.path.dirname(folder), prefix=".making-")
    try:
      write(staging, root, max_chars)
      os.rename(staging, folder)
    except OSError:
      shutil.rmtree(staging, ignore_errors=True)
      if not os.path.isdir(folder):  # Not another process's win: a real failure.
        raise
  return folder


def instruction_task(vocabulary: Any, source_dir: str | None = None, max_chars: int = 1500):
  """The chat task (tasks/formats/chat.py) over the library's instructions, train and
  validation, tokenized by `vocabulary` (a PretrainedTokenizer with a chat template)."""
  from tasks.formats import chat  # pylint: disable=g-import-not-at-top
  folder = os.path.join(data_folder(source_dir, max_chars), "instructions")
  return chat.chat_task({split: os.path.join(folder, f"{split}.jsonl")
                         for split in pycode.SPLITS}, vocabulary)


def preference_task(vocabulary: Any, source_dir: str | None = None, max_chars: int = 1500):
  """The preference task (tasks/formats/preference.py) over the library's pairs."""
  from tasks.formats import preference as preference_format  # pylint: disable=g-import-not-at-top
  folder = os.path.join(data_folder(source_dir, max_chars), "preferences")
  return preference_format.preference_task({split: os.path.join(folder, f"{split}.jsonl")
                                            for split in pycode.SPLITS}, vocabulary)
