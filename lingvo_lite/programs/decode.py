"""The decode program: a job's checkpoint (or, before it has one, the weights its config starts
from: `train.init_from`) generates completions of prompts.

  --mode=decode --job_log_dir=JOB --prompt='def main('              the latest checkpoint
  --mode=decode --job_log_dir=JOB --prompts_file=p.jsonl --checkpoint_step=N
  --mode=decode --job_log_dir=JOB --prompt=... --decode_out=-       JSON lines on stdout
  --mode=decode --exp=E --job_log_dir=NEW --prompt=...              before a job has a
                                                                    checkpoint: the weights
                                                                    E starts from

The model is loaded as serve loads it (serving/loaded_model.py over weights/job_params.py):
only the parameters are restored, into the partitioner's shardings (no optimizer is built, no
optimizer state read or allocated); the decode state (KV cache and
slots) is sharded with the slots over the data-parallel axes and the key/value heads over
`tensor`. Every request is checked (its fields, its tokens against the model's vocabulary and
the cache) before the checkpoint is read. Completions go to JOB/decode/<UTC time>.jsonl
(schema: lingvo_lite/decode/records.py), never into the training files; printed as text as well
when stdout is a terminal.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable

from absl import logging
from etils import epath

from lingvo_lite import outputs
from lingvo_lite.checkpoints import selection as checkpoint_selection
from lingvo_lite.decode import (records as decode_records, request_resolver,
                                requests as decode_requests)
from lingvo_lite.errors import os_error_text
from lingvo_lite.programs import (Invocation, ProgramFailure, record_config_where_missing,
                                 refuse_model_changes)
from lingvo_lite.programs.options import checkpoint_step_option, init_from_option, option
from lingvo_lite.runtime.job_dirs import FOLDER, JobFiles
from lingvo_lite.runtime.stop_request import StopRequest
from lingvo_lite.serving.loaded_model import ModelLoader
from lingvo_lite.weights import sources
from lingvo_lite.weights.job_params import JobParams


@dataclasses.dataclass(frozen=True)
class Options:
  """The flags of --mode=decode."""

  checkpoint_step: int | None = checkpoint_step_option()
  init_from: str | None = init_from_option()
  prompt: list[str] | None = option(
      None, "--mode=decode: a prompt to continue (repeatable).", repeated=True)
  prompts_file: str | None = option(
      None, "--mode=decode: a JSON-lines file of requests, one object per line: prompt (text) "
      "or prompt_ids, and optional max_new_tokens, temperature, top_k, top_p, seed, stop.",
      non_empty=True)
  decode_out: str | None = option(
      None, "--mode=decode: where the completions go as JSON lines: a file, or - for stdout "
      "(default: JOB/decode/<UTC time>.jsonl).", non_empty=True)

  def config_parts(self, cfg: Any) -> dict[str, Any]:
    """`train.init_from` (and a source's `model`) from --init_from (weights/sources.py): a job
    dir without a checkpoint of its own decodes the source's parameters."""
    return sources.config_parts(self.init_from, cfg)


# JOB/decode/ is written only when the completions go there (not with --decode_out), so the
# program checks that it can write there itself (decode/records.py): a read-only job dir
# serves a decode to stdout.
JOB_FILES = JobFiles(kind_only=(("decode", FOLDER),), records_config=True)


class _InOrder:
  """Writes completions in request order as soon as every earlier one is in: a long decode
  leaves what it finished on disk, and the file reads in the order the requests were given."""

  def __init__(self, writer: decode_records.CompletionWriter):
    self._writer = writer
    self.done: dict[int, Any] = {}
    self._next = 0

  def add(self, index: int, completion: Any) -> None:
    self.done[index] = completion
    while self._next in self.done:
      self._writer.write(self.done[self._next], self._next)
      self._next += 1


def main(invocation: Invocation) -> None:
  """SIGTERM or Ctrl-C, from here on, stops the decode between device calls: one line, the
  completions finished so far kept in a `.partial` file, exit code 1 (the answers are not
  all there)."""
  with StopRequest() as stop:
    _decode(invocation, stop)


def _decode(invocation: Invocation, stop: StopRequest) -> None:
  options: Options = invocation.options
  setup = invocation.setup
  refuse_model_changes(invocation, "decode")
  step = options.checkpoint_step
  checkpoint_selection.check_wanted(step)
  requests = decode_requests.from_flags(options.prompt, options.prompts_file)
  to_stdout = decode_records.is_stdout(options.decode_out)
  # Where the completions go is checked first (nothing is created until the first one).
  writer = decode_records.CompletionWriter(options.decode_out, invocation.job_dir,
                                           invocation.shown_job_dir)
  # Messages go to stderr when stdout carries the JSON lines.
  say = (lambda text: print(text, file=sys.stderr, flush=True)) if to_stdout else (
      lambda text: print(text, flush=True))
  shown = epath.Path(invocation.shown_job_dir) if invocation.shown_job_dir else \
      invocation.job_dir
  # Where the parameters come from, the decode shapes against the mesh and the memory, and
  # every request, before the checkpoint is read: a bad one is one line, and nothing is
  # allocated.
  loader = ModelLoader(JobParams(setup, invocation.job_dir, shown, step,
                                 devices=invocation.target.devices))
  checker = request_resolver.RequestResolver(setup, loader.vocabulary)
  prompt_lengths = [len(checker.resolve(index, request).prompt_ids)
                    for index, request in enumerate(requests)]

  def shown_path() -> str:  # The name is chosen at the first completion (a -2 suffix, ...).
    return "stdout" if to_stdout else str(options.decode_out
                                          or shown / "decode" / writer.path.name)

  with writer:
    generator = loader.load().generator  # The target is active already (the executor's).
    # Once the weights are in hand: a source that cannot be read leaves a new job dir unmade.
    record_config_where_missing(invocation)
    completions, seconds = _generate(generator, requests, prompt_lengths, writer, stop,
                                     shown_path, to_stdout)
  tokens = sum(len(c.completion_ids) for c in completions)
  try:
    say(f"decoded {len(completions)} prompt(s) with {loader.params.describe()}: {tokens} tokens "
        f"in {seconds:.2f} s ({tokens / max(seconds, 1e-9):,.0f} tokens/s); written to "
        f"{shown_path()}")
  except OSError:  # Stdout carried only this message: the completions are written.
    outputs.silence_stdout()
  logging.info("decode: prefill buckets used %s", sorted(generator.compiled_prefill_buckets))


def _generate(generator: Any, requests: list[Any], prompt_lengths: list[int],
              writer: decode_records.CompletionWriter, stop: StopRequest,
              shown_path: Callable[[], str], to_stdout: bool) -> tuple[list[Any], float]:
  """(the completions, the seconds decoding took), each written as soon as those before it
  are, the file named once all are; a failed write, or a stop, is one line keeping what was
  finished in `.partial`."""
  in_order = _InOrder(writer)
  with generator.activated():
    generator.warm(prompt_lengths)  # Compiles now: the time below is decoding's.
  started = time.perf_counter()
  try:
    completions = generator.generate(requests, on_completion=in_order.add,
                                     should_stop=lambda: stop.should_stop(0))
  except OSError as e:  # A full disk, a read-only remount, a reader that closed the pipe.
    writer.close(succeeded=False)
    kept = f"; the {writer.count} finished are in {shown_path()}.partial" if (
        writer.count and not to_stdout) else ""
    raise ProgramFailure(outputs.failed_write(f"the completions to {shown_path()}", e,
                                              "decode again", to_stdout) + kept) from None
  seconds = time.perf_counter() - started
  if stop.signal_name is not None:
    writer.close(succeeded=False)
    where = "on stdout" if to_stdout else f"in {shown_path()}.partial"
    kept = f"; the {writer.count} written are {where}" if writer.count else ""
    raise ProgramFailure(f"decode stopped by {stop.signal_name} after {len(in_order.done)} "
                         f"of {len(requests)} completions{kept}")
  try:
    writer.close()
  except OSError as e:  # The final name was taken meanwhile, or the last write failed.
    problem, fix = os_error_text(e, "rename the .partial yourself")
    raise ProgramFailure(f"cannot name the completions {shown_path()}: {problem}; they are "
                         f"in {shown_path()}.partial: {fix}") from None
  return completions, seconds
