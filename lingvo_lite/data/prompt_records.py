"""A prompt record: one prompt a policy answers, with what its rewards read.

  {"id": "arithmetic-train-0-0", "prompt": "Mia has 12 apples ... <answer></answer> tags.",
   "answer": 20}
  {"id": 7, "system": "You write Python.", "messages": [{"role": "user", "content": "..."}],
   "tests": "assert add(2, 3) == 5"}

- `id`: a non-empty string or an integer, unique in its set (a reward's failure names it).
- `prompt` (a string: one user message) or `messages` (the conversation so far, ending with
  the user's turn: the policy writes the next assistant message), not both; an optional
  `system` string, as the chat and preference formats take it (tasks/formats/chat.py).
- The fields the built-in rewards read (`FIELDS`: `answer`, `tests`, `entry_point`,
  `code_prefix`), each of the kind its reward takes; any other field is kept as it is (a
  reference `completion`, for SFT on the same set). A run's rewards may require fields
  (`rewards.registry.required_fields`), which every record must then have.
- No string a JSON escape made of a lone surrogate (no tokenizer or file takes it).

`checked_record` says why a record breaks these (`RecordError`: one line, without the file
and the line, which the reader adds: data/prompt_data.py). `prompt_text` is the text a policy
continues: the conversation through the tokenizer's chat template, as the server renders a chat
request.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

from lingvo_lite.errors import shown

ROLES = ("system", "user", "assistant")


class RecordError(Exception):
  """Why one record cannot be used (one line, without the file and line)."""


def _answer(value: Any) -> None:
  if isinstance(value, str):
    if not value.strip():
      raise RecordError("'answer' is empty")
    return
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise RecordError(f"'answer' holds a {type(value).__name__}, not a string or a number")
  if not math.isfinite(value):
    raise RecordError(f"'answer' is {value}, not a finite number")


def _tests(value: Any) -> None:
  lines = value if isinstance(value, list) else [value]
  if not lines or not all(isinstance(line, str) for line in lines):
    raise RecordError("'tests' is neither Python source nor a list of lines")
  if not "".join(lines).strip():
    raise RecordError("'tests' is empty")


def _entry_point(value: Any) -> None:
  if not isinstance(value, str) or not value.isidentifier():
    raise RecordError(f"'entry_point' {shown(value, 60)} is not a Python name")


def _string(field: str):
  def check(value: Any) -> None:
    if not isinstance(value, str):
      raise RecordError(f"{field!r} holds a {type(value).__name__}, not a string")
  return check


# The fields the built-in rewards read, and the kinds they take (rewards/: exact_answer,
# code_tests).
FIELDS = {"answer": _answer, "tests": _tests, "entry_point": _entry_point,
          "code_prefix": _string("code_prefix")}


def _messages(value: Any) -> None:
  if not isinstance(value, list) or not value:
    raise RecordError("'messages' is not a non-empty list of messages")
  for index, message in enumerate(value):
    if not isinstance(message, dict):
      raise RecordError(f"message {index} is a {type(message).__name__}, not an object")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
      raise RecordError(f"message {index} has role {shown(role, 40)}; valid roles: "
                        f"{', '.join(ROLES)}")
    if role == "system" and index:
      raise RecordError(f"message {index} has role 'system'; only the first may")
    if not isinstance(content, str):
      raise RecordError(f"message {index} has no string 'content'")
  if value[-1]["role"] != "user":
    raise RecordError(f"the last message's role is {value[-1]['role']!r}, not 'user' (the "
                      "policy answers the user's last message)")


def _prompt(record: dict) -> None:
  has_prompt, has_messages = "prompt" in record, "messages" in record
  if has_prompt == has_messages:
    raise RecordError("has both 'prompt' and 'messages'; give one" if has_prompt else
                      "has neither a string 'prompt' nor a list of 'messages' "
                      f"(its fields: {shown(sorted(map(str, record)))})")
  if has_prompt:
    if not isinstance(record["prompt"], str):
      raise RecordError(f"'prompt' holds a {type(record['prompt']).__name__}, not a string")
    if not record["prompt"].strip():
      raise RecordError("'prompt' is empty")
  else:
    _messages(record["messages"])
  if "system" in record:
    if not isinstance(record["system"], str):
      raise RecordError(f"'system' holds a {type(record['system']).__name__}, not a string")
    if has_messages and record["messages"][0]["role"] == "system":
      raise RecordError("has both 'system' and a first message of role 'system'")


def _unicode(value: Any) -> None:
  """Refuses a string JSON escapes made of a lone surrogate (`"\\ud800"`): no tokenizer or
  file takes it."""
  pending = [value]
  while pending:
    item = pending.pop()
    if isinstance(item, str):
      try:
        item.encode("utf-8")
      except UnicodeEncodeError as e:
        raise RecordError(f"holds text that is not valid Unicode ({e.reason})") from None
    elif isinstance(item, dict):
      pending.extend(item.keys())
      pending.extend(item.values())
    elif isinstance(item, list):
      pending.extend(item)


def checked_record(record: Any, required_fields: Sequence[str] = ()) -> dict:
  """`record` if it is a usable prompt record (module doc).

  Raises:
    RecordError: why it is not.
  """
  if not isinstance(record, dict):
    raise RecordError(f"not a JSON object but a {type(record).__name__}")
  _unicode(record)
  if "id" not in record:
    raise RecordError(f"has no field 'id' (its fields: {shown(sorted(record))})")
  key = record["id"]
  if isinstance(key, bool) or not isinstance(key, (str, int)) or (
      isinstance(key, str) and not key.strip()):
    raise RecordError(f"'id' {shown(key, 60)} is not a non-empty string or an integer")
  _prompt(record)
  for field in required_fields:
    if field not in record:
      raise RecordError(f"has no field {field!r}, which the run's rewards read")
  for field, check in FIELDS.items():
    if field in record:
      check(record[field])
  return record


def messages_of(record: dict) -> list[dict[str, str]]:
  """The conversation a record's prompt is: its `system` string first, then its `messages`, or
  its `prompt` as one user message."""
  system = [{"role": "system", "content": record["system"]}] if "system" in record else []
  if "messages" in record:
    return system + [dict(m) for m in record["messages"]]
  return system + [{"role": "user", "content": record["prompt"]}]


def prompt_text(record: dict, tokenizer: Any = None) -> str:
  """The text a policy continues for `record`: its conversation (`messages_of`) rendered with
  the tokenizer's chat template up to where the assistant speaks, as the server's chat
  completions render it (data/chat_template.py); with no tokenizer or no template, the
  record's `prompt` as it is.

  Args:
    record: A checked prompt record.
    tokenizer: A `pretrained_tokenizer.TokenizerFiles`, or None.

  Raises:
    RecordError: a record of `messages` or a `system` string, with no chat template to
      render it; the template failed on it or refused it.
  """
  if tokenizer is not None and tokenizer.chat_template:
    from lingvo_lite.data import chat_template  # pylint: disable=g-import-not-at-top
    try:
      return chat_template.render_with(tokenizer, messages_of(record),
                                       add_generation_prompt=True)
    except chat_template.TemplateError as e:
      raise RecordError(str(e)) from None
  if "messages" in record or "system" in record:
    raise RecordError("holds a conversation ('messages' or 'system'), which takes a tokenizer "
                      "with a chat template to render")
  return record["prompt"]
