"""Prompt records as a train data source: what an objective that samples its own rows reads
(training/objectives/grpo.py, `train_data = fdl.Config(PromptSource, prompts=..., ...)`).

A step's batch is `{"records": [...]}`: this process's records of the prompt set's step
(data/prompt_data.py: a deterministic, resumable order, so the data position is the step),
each with its prompt's token ids added as `prompt_ids`. With a pretrained tokenizer that
carries a chat template (and `chat`), the prompt is the record's conversation
(`prompt_records.messages_of`: its system string, then its messages or its prompt as one user
message) rendered with the assistant's turn opened, its markers read as their special tokens,
as the server renders a chat request; otherwise the `prompt` text tokenized as it is.

The source holds no token rows: `sequence_length` is the length of the rows the objective
makes (a prompt and its completion) and `global_batch_size` the prompts per step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

from lingvo_lite.data import chat_template, pretrained_tokenizer
from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer
from lingvo_lite.data.prompt_data import PromptData
from lingvo_lite.data.prompt_records import messages_of
from lingvo_lite.data.text_vocabulary import TextVocabulary
from lingvo_lite.data.vocabulary import VocabularyFacts
from lingvo_lite.errors import DataError
from lingvo_lite.fields import PositiveInt


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptSource:
  """A prompt set (data/prompt_data.py) tokenized for sampling.

  Attributes:
    prompts: The prompt set and its order (its `prompts_per_step`: the prompts of a step).
    tokenizer: The policy's tokenizer (its ids, its chat template).
    sequence_length: Tokens of a train row: a prompt and its completion.
    chat: Render each prompt with the tokenizer's chat template (False: its text as it is).
  """

  prompts: PromptData
  tokenizer: PretrainedTokenizer
  sequence_length: PositiveInt
  chat: bool = True

  # Its rows are prompt records (training/objectives/objective.py's `rows_of`).
  prompt_records: ClassVar[bool] = True
  num_batches: ClassVar[None] = None

  @property
  def global_batch_size(self) -> int:
    return self.prompts.prompts_per_step

  @functools.cached_property
  def tokenizer_files(self) -> pretrained_tokenizer.TokenizerFiles:
    return pretrained_tokenizer.read(self.tokenizer)

  @functools.cached_property
  def text_vocabulary(self) -> TextVocabulary:
    """The ids to text and back (completions are decoded with it)."""
    files = self.tokenizer_files
    return TextVocabulary(VocabularyFacts(files.fingerprint(), files.vocab_size,
                                          tokenizer=files))

  @property
  def vocab_size(self) -> int:
    return self.tokenizer_files.vocab_size

  def check(self) -> None:
    """Reads the prompt set and the tokenizer before a run starts (one line for a problem)."""
    self.prompts.check()
    _ = self.text_vocabulary  # Read now: a tokenizer that cannot be read is one line.

  def prompt_ids(self, record: dict) -> list[int]:
    """The token ids of `record`'s prompt (module doc)."""
    files = self.tokenizer_files
    if self.chat and files.chat_template:
      try:
        text = chat_template.render_with(files, messages_of(record), True)
      except chat_template.TemplateError as e:
        raise DataError(f"train_data: prompt {record.get('id')!r}: {e}") from None
      return pretrained_tokenizer.encode_with_special_tokens(files, text)
    if "prompt" not in record:
      raise DataError(f"train_data: prompt {record.get('id')!r} has messages, and "
                      f"train_data.tokenizer ({files.source}) no chat template to render "
                      "them; give prompt text, or a tokenizer with a chat template")
    return [int(i) for i in self.text_vocabulary.encode(record["prompt"])]

  def batch(self, step: int, process_index: int = 0, process_count: int = 1
            ) -> dict[str, Any]:
    """This process's records of step `step`, each with its `prompt_ids`."""
    records = self.prompts.step_records(step, process_index, process_count)
    return {"records": [{**record, "prompt_ids": self.prompt_ids(record)}
                        for record in records]}

  def batch_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
    """No token arrays: the objective makes the train rows (its `training_batch_spec`)."""
    return {}
