"""Preference pairs for DPO: JSON lines of a prompt and two answers, the one preferred
(`chosen`) and the other (`rejected`), as TRL's preference data sets write them.

  {"prompt": "Reverse a list.", "chosen": "def reverse(x): return x[::-1]",
   "rejected": "def reverse(x): return x"}
  {"messages": [{"role": "system", ...}, {"role": "user", ...}],
   "chosen": [{"role": "assistant", "content": ...}], "rejected": [...]}

The prompt is `prompt` (a string: one user message) or `messages` (the conversation before the
answer), with an optional `system` string; an answer is a string (one assistant message) or a
list of messages. Each side is rendered with the tokenizer's chat template as the prompt plus
its answer, weighted 1 on the answer's assistant tokens and their end-of-turn token
(lingvo_lite/data/chat_template.py), and stored as a document: a pair is two consecutive
documents, chosen then rejected. `data/preference_data.PreferenceStoreData` packs whole pairs
into rows, so a pair never splits across rows. Bad records are one line naming the file and
the line, or counted with `--skip_bad_records`.

A pair whose two sides template and tokenize to the same tokens (the same answer twice, or
two that differ only where the template does not look: `data/store_build.equal_pair`) gives
DPO nothing to learn: the build counts such pairs (a warning line says how many), refuses a
split of nothing else, and with `--skip_bad_records` drops them as bad records. A row of the
formats' table (tasks/formats/__init__.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lingvo_lite.data import chat_template, pretrained_tokenizer, store_build
from tasks.deferred import DeferredTask
from tasks.formats.chat import SKIP, Examples, templated_task
from tasks.formats.row import Files, Format


def _answer(record: dict, field: str) -> list[dict[str, str]]:
  if field not in record:
    raise chat_template.ConversationError(
        f"has no field {field!r} (its fields: {', '.join(sorted(map(str, record)))})")
  value = record[field]
  if isinstance(value, str):
    return [{"role": "assistant", "content": value}]
  if isinstance(value, list) and value:
    return value
  raise chat_template.ConversationError(f"{field!r} is neither a string nor a list of messages")


def _prompt(record: dict) -> list[dict[str, str]]:
  if "messages" in record:
    prompt = record["messages"]
    if not isinstance(prompt, list):
      raise chat_template.ConversationError("'messages' is not a list of messages")
    return list(prompt)
  if isinstance(record.get("prompt"), str):
    return [{"role": "user", "content": record["prompt"]}]
  raise chat_template.ConversationError(
      "has neither a string 'prompt' nor a list of 'messages' before the answers")


def _pair(files: pretrained_tokenizer.TokenizerFiles, skip: bool) -> Examples:
  """A record's two sides; under `skip`, an equal pair is a bad record (dropped, counted)."""
  def examples(record: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    prompt = _prompt(record)
    sides = []
    for field in ("chosen", "rejected"):
      messages = chat_template.checked_messages(prompt + _answer(record, field),
                                                record.get("system"))
      first_answer = len(messages) - len(_answer(record, field))
      answer = [i for i in range(first_answer, len(messages))
                if messages[i]["role"] == "assistant"]
      if not answer:
        raise chat_template.ConversationError(f"{field!r} has no assistant message")
      sides.append(chat_template.conversation_tokens(files, messages, answer))
    if skip and store_build.equal_pair(*sides):
      raise chat_template.ConversationError(
          "'chosen' and 'rejected' are the same tokens once templated (DPO learns nothing "
          "from the pair)")
    return sides
  return examples


def preference_task(files: Files, vocabulary: Any,
                    skip_bad_records: bool = False) -> DeferredTask:
  """Preference pairs (see the module doc): each pair two documents, chosen then rejected.

  Args:
    files: Split name -> glob pattern or list of patterns of JSON-lines files.
    vocabulary: A `PretrainedTokenizer` whose tokenizer carries a chat template.
    skip_bad_records: Count bad records instead of failing on the first.
  """
  task = templated_task("preference", files, vocabulary,
                        lambda tokenizer: _pair(tokenizer, bool(skip_bad_records)),
                        skip_bad_records, {"equal_pairs": "counted"})
  task.document_pairs = True  # What data/preference_data.py reads it for.
  return task


FORMAT = Format(
    lambda files, vocabulary, settings: preference_task(files, vocabulary,
                                                        settings["skip_bad_records"]),
    (SKIP,))
