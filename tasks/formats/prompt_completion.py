"""JSON lines of prompt and completion, for fine-tuning on the completion only: a document is
tokens(prompt) + tokens(completion) + EOS, weighted 0 over the prompt. A row of the formats'
table (tasks/formats/__init__.py)."""

from __future__ import annotations

from lingvo_lite.data import vocabulary as vocab_lib
from lingvo_lite.runtime.tensorflow_import import import_tensorflow
from tasks import local_files
from tasks.deferred import DeferredTask
from tasks.formats.row import Format, Setting
from tasks.local_readers import check_json_fields, json_records, text_field


def read_prompt_completion(path: str, prompt_field: str, completion_field: str):
  for number, record in json_records(path):
    prompt = text_field(record, prompt_field, path, number)
    completion = text_field(record, completion_field, path, number)
    yield {"prompt": prompt, "completion": completion, "text": prompt + completion}



def prompt_completion_task(files: dict[str, str | list[str]],
                           vocabulary: vocab_lib.SentencePieceModel | str | None = None,
                           prompt_field: str = "prompt",
                           completion_field: str = "completion") -> DeferredTask:
  """Prompt/completion JSON lines for fine-tuning: the loss counts only the completion.

  A document is tokens(prompt) + tokens(completion) + EOS (the two tokenized apart), with
  `weights` 0 over the prompt and 1 over the completion and EOS. A vocabulary is trained on
  prompt + completion.

  Args:
    files: Split name -> glob pattern or list of patterns.
    vocabulary: As for `text_files_task`.
    prompt_field: The field holding the prompt (a string, maybe empty).
    completion_field: The field holding the completion (a string, maybe empty).

  Raises:
    UsageError, DataError: as for `json_lines_task`, for either field.
  """
  fields = {"prompt_field": prompt_field, "completion_field": completion_field}
  for path, name in fields.items():
    local_files.check_name(path, name)
  reader = lambda path: read_prompt_completion(path, prompt_field, completion_field)
  check = lambda path: check_json_fields(path, fields)
  return local_files.text_task("prompt_completion", files, vocabulary, fields, reader, check,
                               fields=("prompt", "completion", "text"),
                               tokenize=_tokenize_prompt_completion, weighted=True)



def _tokenize_prompt_completion(dataset, output_features):
  tf = import_tensorflow()
  vocabulary = output_features["targets"].vocabulary
  eos = tf.constant([vocabulary.eos_id], tf.int32)

  def tokenize(example):
    prompt = tf.cast(vocabulary.encode_tf(example["prompt"]), tf.int32)
    completion = tf.cast(vocabulary.encode_tf(example["completion"]), tf.int32)
    weights = tf.concat([tf.zeros(tf.shape(prompt), tf.float32),
                         tf.ones(tf.shape(completion)[0] + 1, tf.float32)], axis=0)
    return {"targets": tf.concat([prompt, completion, eos], axis=0), "weights": weights}

  return dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)


FORMAT = Format(
    lambda files, vocabulary, settings: prompt_completion_task(
        files, vocabulary, settings["prompt_field"], settings["completion_field"]),
    (Setting("prompt_field", "prompt", help="the JSON field holding the prompt (default: prompt)"),
     Setting("completion_field", "completion",
             help="the JSON field holding the completion (default: completion)")))
