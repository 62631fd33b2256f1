"""lingvo_lite as an lm-evaluation-harness model, registered as `lingvo_lite`:

  python bin/lm_eval.py --model lingvo_lite --model_args job_log_dir=runs/smol \\
      --tasks lingvo_lite_pycode_choice --include_path tasks/lm_eval

model_args: `job_log_dir` (required: a job dir, or a new one with `exp`), `exp` (an experiment
for a job dir without a config), `init_from` (hf:PATH, gguf:PATH or JOB[@STEP], as
--init_from), `checkpoint_step`, `max_length` (the longest sequence scored: the model's context
unless given), `max_gen_toks` (generate_until's default, 256), `score_tokens` (about how many
tokens one scoring call holds; default 4096), and any config field by its dotted path, as
--fdl.PATH=VALUE sets it (`decode.slots=4,decode.cache_length=512`).

`--apply_chat_template` renders each request through the tokenizer's own chat template, as
chat training data and the server's /v1/chat/completions render it (data/chat_template.py); a
task's `gen_prefix` begins the assistant's answer, which the model continues
(tasks/lm_eval/humaneval_chat.yaml). A sampled request without a seed of its own gets its
index in the call as its seed, so a task's `repeats` are different samples, the same on every
run.

The same scores through the server: lm_eval's `local-completions` model asks for one generated
token after each echoed prompt and keeps a position for it (it scores at most its `max_length`
less one): give it `max_length` equal to the server's `decode.cache_length`, and this model
that less one to compare the two. The mesh is the config's partitioner
over this host's devices. lm_eval's `--batch_size` is accepted and not needed: every request
of a call is packed into rows (harness/request_kinds.py says how each kind is answered).

It subclasses lm_eval's `LM`, not `TemplateLM`, whose pair encoding imports transformers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Mapping

# lm_eval's own models (hf, local-completions, ...) are registered by importing
# lm_eval.models; its CLI does, but a program calling simple_evaluate after importing only this
# module would find `lingvo_lite` alone in the registry.
import lm_eval.models  # noqa: F401  pylint: disable=unused-import
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from lingvo_lite.data import chat_template as templates
from lingvo_lite.decode.sampling_checks import kind
from lingvo_lite.errors import UsageError, config_error
from lingvo_lite.harness import request_kinds as harness_requests
from lingvo_lite.serving import loaded_model

# lingvo_lite's own task files (YAML, data, metric code), hashed into every result.
TASK_FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tasks", "lm_eval")

# What lm_eval's command line passes every model besides --model_args.
_HARNESS_SETTINGS = ("batch_size", "max_batch_size", "device")
_TEXT_ARGUMENTS = ("job_log_dir", "exp", "init_from")
# The integer arguments and their least value.
_INT_ARGUMENTS = {"checkpoint_step": 0, "max_length": 1, "max_gen_toks": 1, "score_tokens": 1}
_HOW = ("give job_log_dir=JOB (a training run's job dir, or a new one with exp=NAME), e.g. "
        "--model_args job_log_dir=runs/a")


@dataclasses.dataclass(frozen=True)
class ModelArguments:
  """The `lingvo_lite` model's arguments, checked (the module doc lists them).

  Attributes:
    assignments: The config fields given by their dotted paths, as `PATH=VALUE`.
  """

  job_log_dir: str
  exp: str | None = None
  init_from: str | None = None
  checkpoint_step: int | None = None
  max_length: int | None = None
  max_gen_toks: int = 256
  score_tokens: int | None = None
  assignments: tuple[str, ...] = ()

  def check_job(self) -> None:
    """What loading the model checks before it reads a parameter (the job dir, experiment,
    weights, checkpoint step, config fields), without reading one.

    Raises:
      UsageError: one line naming the argument.
    """
    loaded_model.check_job(self.job_log_dir, exp=self.exp, init_from=self.init_from,
                           checkpoint_step=self.checkpoint_step, assignments=self.assignments)


def model_arguments(given: Mapping[str, Any] | None) -> ModelArguments:
  """`--model_args` as lm_eval's command line parses them (`checkpoint_step=5` arrives as an
  int, `checkpoint_step=abc` as a str, `--model_args ''` as {}), checked.

  Args:
    given: The arguments by name; None where --model_args was not given.

  Raises:
    UsageError: one line naming the argument, its value and the fix.
  """
  if given is None:
    raise UsageError(f"--model_args: missing; {_HOW}")
  if not given:
    raise UsageError(f"--model_args='': empty; {_HOW}")
  known = _TEXT_ARGUMENTS + tuple(_INT_ARGUMENTS) + _HARNESS_SETTINGS
  unknown = sorted(name for name in given if name not in known and "." not in name)
  if unknown:
    raise UsageError(f"--model_args {unknown[0]}: not an argument of the lingvo_lite model; "
                     "use job_log_dir, exp, init_from, checkpoint_step, max_length, "
                     "max_gen_toks, score_tokens, or a config field's dotted path")
  if "job_log_dir" not in given:
    raise UsageError(f"--model_args: job_log_dir is missing; {_HOW}")
  for name in _TEXT_ARGUMENTS:
    value = given.get(name)
    if value == "":
      raise config_error(f"--model_args {name}", value, "is empty",
                         "give a value, or leave it out")
    if value is not None and not isinstance(value, str):
      # lm_eval reads `job_log_dir=007` as the int 7: a name must be quoted to stay text.
      raise config_error(f"--model_args {name}", value, f"is {kind(value)}, not text",
                         f"quote it: --model_args \"{name}='NAME'\"")
  for name, least in _INT_ARGUMENTS.items():
    value = given.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < least):
      raise config_error(f"--model_args {name}", value, f"must be an integer >= {least}",
                         "give a step the job saved, or leave it out for its newest"
                         if name == "checkpoint_step" else f"give an integer >= {least}")
  # A dotted name is a config field (decode.slots=4), set as --fdl.decode.slots=4 would.
  assignments = tuple(f"{name}={value}" for name, value in given.items() if "." in name)
  return ModelArguments(**{name: given[name] for name in _TEXT_ARGUMENTS + tuple(_INT_ARGUMENTS)
                           if given.get(name) is not None}, assignments=assignments)


@register_model("lingvo_lite")
class LingvoLiteLM(LM):
  """See the module doc."""

  def __init__(self, job_log_dir: str | None = None, exp: str | None = None,
               init_from: str | None = None, checkpoint_step: int | None = None,
               max_length: int | None = None, max_gen_toks: int | None = None,
               score_tokens: int | None = None, **harness_settings: Any):
    super().__init__()
    given = {"job_log_dir": job_log_dir, "exp": exp, "init_from": init_from,
             "checkpoint_step": checkpoint_step, "max_length": max_length,
             "max_gen_toks": max_gen_toks, "score_tokens": score_tokens, **harness_settings}
    arguments = model_arguments({k: v for k, v in given.items() if v is not None} or None)
    self.model = loaded_model.from_job(
        arguments.job_log_dir, exp=arguments.exp, init_from=arguments.init_from,
        checkpoint_step=arguments.checkpoint_step, assignments=arguments.assignments,
        score_tokens=arguments.score_tokens)
    self.max_gen_toks = arguments.max_gen_toks
    self.max_length = arguments.max_length

  @property
  def weights_checksum(self) -> str:
    return self.model.checksum

  def get_model_info(self) -> dict[str, Any]:
    """What lm_eval records in its results' `config`: the weights (and their checksum) and
    the hash of each of lingvo_lite's task files, so a result names what produced it."""
    return {"lingvo_lite_weights": self.model.weights,
            "weights_checksum": self.model.checksum, "task_files": task_file_hashes()}

  def _chat_files(self) -> Any:
    files = self.model.tokenizer_files
    if files is None or not files.chat_template:
      raise UsageError("--apply_chat_template: this model's tokenizer carries no chat template "
                       "(a Hugging Face folder's tokenizer_config.json or a GGUF file's "
                       "tokenizer.chat_template gives one); leave the flag out")
    return files

  @property
  def tokenizer_name(self) -> str:
    """What lm_eval keys its request cache by under a chat template: the template's hash."""
    template = self._chat_files().chat_template
    return f"lingvo_lite-chat-{hashlib.sha256(template.encode()).hexdigest()[:16]}"

  def chat_template(self, chat_template: bool | str = False) -> str | None:
    """The tokenizer's own template (lm_eval records it); a named one is not offered."""
    if chat_template is False or chat_template is None:
      return None
    if isinstance(chat_template, str) and chat_template:
      raise UsageError(f"--apply_chat_template={chat_template}: lingvo_lite renders the "
                       "tokenizer's own template only; give --apply_chat_template alone")
    return self._chat_files().chat_template

  def apply_chat_template(self, chat_history: list[dict[str, str]],
                          add_generation_prompt: bool = True) -> str:
    """The messages through the tokenizer's chat template as training and the server render
    them (data/chat_template.py); without `add_generation_prompt`, the last (assistant)
    message left open to be continued (lm_eval's `gen_prefix`)."""
    files = self._chat_files()
    try:
      if add_generation_prompt:
        return templates.render_with(files, chat_history, add_generation_prompt=True)
      return templates.render_continuing(files, chat_history)
    except templates.TemplateError as e:
      raise UsageError(f"--apply_chat_template: {e}") from None

  def loglikelihood(self, requests, disable_tqdm: bool = False):
    return harness_requests.loglikelihood(self.model, [r.args for r in requests],
                                          self.max_length)

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
    return harness_requests.loglikelihood_rolling(self.model, [r.args[0] for r in requests],
                                                  self.max_length)

  def generate_until(self, requests, disable_tqdm: bool = False):
    return harness_requests.generate_until(self.model, [r.args for r in requests],
                                           self.max_gen_toks)


def task_file_hashes(folder: str = TASK_FOLDER) -> dict[str, str]:
  """{file name: 'sha256:<hex>'} of every file in `folder` (lingvo_lite's lm_eval tasks)."""
  hashes = {}
  for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
    path = os.path.join(folder, name)
    if os.path.isfile(path):
      with open(path, "rb") as f:
        hashes[name] = f"sha256:{hashlib.sha256(f.read()).hexdigest()}"
  return hashes
