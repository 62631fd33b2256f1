"""Chat conversations for supervised fine-tuning: JSON lines of OpenAI-style `messages` (and an
optional `system` string), each rendered with the tokenizer's own chat template, tokenized, and
weighted 1 on the assistant's tokens and its end-of-turn token, 0 elsewhere
(lingvo_lite/data/chat_template.py), so the loss and bits per byte count the assistant's tokens
only. A conversation is one document: the token store packs conversations as it packs text,
with document masking, and appends nothing (the template ends each turn itself).

  {"messages": [{"role": "user", "content": "Reverse a list."},
                {"role": "assistant", "content": "def reverse(items): ..."}]}
  {"system": "You write Python.", "messages": [...]}

The vocabulary must be a pretrained tokenizer that carries a chat template
(`--vocabulary=tokenizer:PATH`: the template `--mode=serve` renders). A record that cannot be
used (not JSON, no assistant message, a role the template does not know, a template that fails
or whose prefixes do not render as prefixes of the whole) is one line naming the file, the line
and the reason; `--skip_bad_records` counts such records instead (the store's summary gives
the count and the first reason). A row of the formats' table (tasks/formats/__init__.py).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from lingvo_lite.data import chat_template
from lingvo_lite.data import pretrained_tokenizer
from lingvo_lite.data import vocabulary as vocab_lib
from lingvo_lite.errors import DataError, config_error
from lingvo_lite.runtime.tensorflow_import import import_seqio
from tasks import local_files
from tasks.deferred import DeferredTask
from tasks.formats.row import Files, Format, Setting
from tasks.local_readers import json_records_or_errors

SKIP = Setting("skip_bad_records", False, flag=True,
               help="chat, preference: count a bad record (and the first one's reason) instead "
               "of stopping the build at it; preference: also drop a pair whose two sides are "
               "the same tokens")

# One record's examples (a conversation, or a preference pair's two) from (path, line, record).
Examples = Callable[[dict], list[tuple[np.ndarray, np.ndarray]]]


def tokenizer_of(vocabulary: Any, kind: str) -> pretrained_tokenizer.TokenizerFiles:
  """The pretrained tokenizer a chat-templated format needs, with its template.

  Raises:
    UsageError: naming --vocabulary, for another kind of vocabulary or one with no template.
  """
  fix = ("give --vocabulary=tokenizer:PATH, a pretrained model's tokenizer (a Hugging Face "
         "folder or a .gguf file) that carries a chat template")
  if not isinstance(vocabulary, vocab_lib.PretrainedTokenizer):
    raise config_error("vocabulary", vocabulary if vocabulary is not None else "bytes",
                       f"the {kind} format renders records with a tokenizer's chat template",
                       fix)
  files = pretrained_tokenizer.read(vocabulary)
  if not files.chat_template:
    raise config_error("vocabulary", vocabulary.path, "the tokenizer carries no chat template",
                       fix)
  return files


def records(path: str, examples: Examples, skip: bool) -> Iterator[dict]:
  """A JSON-lines file's examples for the task's source: each record's (ids, weights) pairs,
  or, for a bad record under `skip`, one example whose `skipped` holds the reason."""
  empty_ids, empty_weights = np.zeros(0, np.int32), np.zeros(0, np.float32)
  for number, record in json_records_or_errors(path):
    try:
      if isinstance(record, DataError):
        raise record
      try:
        made = examples(record)
      except chat_template.ConversationError as e:
        raise DataError(f"{path}: line {number}: {e}") from None
    except DataError as e:
      if not skip:
        raise
      yield {"targets": empty_ids, "weights": empty_weights, "skipped": str(e).encode()}
      continue
    for ids, weights in made:
      yield {"targets": ids, "weights": weights, "skipped": b""}


def templated_task(kind: str, files: Files, vocabulary: Any, examples_of: Callable[
    [pretrained_tokenizer.TokenizerFiles], Examples], skip: bool,
                   naming: dict[str, Any] | None = None) -> DeferredTask:
  """The task over JSON lines whose records `examples_of(tokenizer)` makes into examples;
  `naming`: what else of the format's reading the task's name (and so its stores) records.

  Raises:
    UsageError: a bad vocabulary, a pattern that matches no file.
  """
  files_ = tokenizer_of(vocabulary, kind)
  vocabulary = local_files.checked_vocabulary(vocabulary, {})
  matched = local_files.match_files(files, local_files.file_is_empty)
  name = local_files.task_name(kind, matched, {"vocabulary": files_.fingerprint(),
                                               "skip_bad_records": bool(skip), **(naming or {})})
  examples = examples_of(files_)
  reader = lambda path: records(path, examples, bool(skip))

  def make():
    tf, seqio = import_seqio()
    signature = {"targets": tf.TensorSpec([None], tf.int32),
                 "weights": tf.TensorSpec([None], tf.float32),
                 "skipped": tf.TensorSpec([], tf.string)}
    return seqio.Task(
        name=name,
        source=local_files.file_source(matched, reader, signature),
        preprocessors=[seqio.CacheDatasetPlaceholder()],
        output_features={
            "targets": seqio.Feature(vocab_lib.resolve_vocabulary(vocabulary, name, lambda: ()),
                                     add_eos=False, dtype=tf.int32),
            "weights": seqio.Feature(seqio.PassThroughVocabulary(size=0), add_eos=False,
                                     dtype=tf.float32)})

  return DeferredTask(name, tuple(matched), files_.vocab_size, make)


def _conversation(files: pretrained_tokenizer.TokenizerFiles) -> Examples:
  def examples(record: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    if "messages" not in record:
      raise chat_template.ConversationError(
          f"has no field 'messages' (its fields: {', '.join(sorted(map(str, record)))})")
    messages = chat_template.checked_messages(record["messages"], record.get("system"))
    return [chat_template.conversation_tokens(files, messages)]
  return examples


def chat_task(files: Files, vocabulary: Any, skip_bad_records: bool = False) -> DeferredTask:
  """Chat conversations (see the module doc): one document per conversation, loss weights on
  the assistant's tokens.

  Args:
    files: Split name -> glob pattern or list of patterns of JSON-lines files.
    vocabulary: A `PretrainedTokenizer` whose tokenizer carries a chat template.
    skip_bad_records: Count bad records instead of failing on the first.
  """
  return templated_task("chat", files, vocabulary, _conversation, skip_bad_records)


FORMAT = Format(
    lambda files, vocabulary, settings: chat_task(files, vocabulary,
                                                  settings["skip_bad_records"]),
    (SKIP,))
