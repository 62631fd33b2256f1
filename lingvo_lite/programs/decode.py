"""The decode program: a job's checkpoint generates completions of prompts.

  --mode=decode --job_log_dir=JOB --prompt='def main('              the latest checkpoint
  --mode=decode --job_log_dir=JOB --prompts_file=p.jsonl --checkpoint_step=N
  --mode=decode --job_log_dir=JOB --prompt=... --decode_out=-       JSON lines on stdout

Only the parameters are restored, into the partitioner's shardings (no optimizer state is
read or allocated); the decode state (KV cache and slots) is sharded with the slots over the
data-parallel axes and the key/value heads over `tensor`. Every request is checked (its
fields, its tokens against the model's vocabulary and the cache) before the checkpoint is
read. Completions go to JOB/decode/<UTC time>.jsonl (schema: lingvo_lite/decode_records.py),
never into the training files; printed as text as well when stdout is a terminal.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Any, Iterator

from absl import logging
from etils import epath

from lingvo_lite import decode_records, decode_requests, generation
from lingvo_lite.checkpoints import Checkpointer
from lingvo_lite.data.source import text_vocabulary
from lingvo_lite.errors import UsageError
from lingvo_lite.programs import Invocation, ProgramFailure, summarize_changes
from lingvo_lite.programs.eval import chosen_step
from lingvo_lite.programs.jitted import JittedSteps


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


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
  """SIGTERM stops a decode as Ctrl-C does (one line, what was finished kept), not silently."""
  def interrupt(signum, frame):
    del signum, frame
    raise KeyboardInterrupt
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = signal.signal(signal.SIGTERM, interrupt)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def main(invocation: Invocation) -> None:
  options, setup = invocation.options, invocation.setup
  changes = [c for c in invocation.config_changes() if c.startswith("model.")]
  if changes:
    raise UsageError(f"--job_log_dir={invocation.shown_job_dir}: the model config differs "
                     f"from the one its checkpoints were trained with "
                     f"({summarize_changes(changes)}); decode with the job's own config "
                     "(drop the --exp and model overrides)")
  step = options.get("checkpoint_step")
  if step is not None and step < 0:
    raise UsageError(f"--checkpoint_step={step}: must be a step number >= 0")
  requests = decode_requests.from_flags(options.get("prompt"), options.get("prompts_file"))
  to_stdout = options.get("decode_out") == "-"
  # Messages go to stderr when stdout carries the JSON lines.
  say = (lambda text: print(text, file=sys.stderr, flush=True)) if to_stdout else (
      lambda text: print(text, flush=True))
  shown = epath.Path(invocation.shown_job_dir) if invocation.shown_job_dir else \
      invocation.job_dir
  checkpoint_dir = invocation.job_dir / "checkpoints"
  checkpointer = Checkpointer(checkpoint_dir, setup.checkpoint, create=False) \
      if checkpoint_dir.exists() else None
  step = chosen_step(checkpointer, checkpoint_dir, step, shown)
  vocabulary = text_vocabulary(setup.train_data)
  jitted = JittedSteps(setup)
  # A generator without parameters first: it checks the decode shapes against the mesh and
  # resolves every request, so a bad one is one line before the checkpoint is read.
  steps = generation.DecodeSteps(setup, jitted.mesh,
                                 generation.end_token(setup, vocabulary))
  checker = generation.RequestResolver(setup, vocabulary)
  for index, request in enumerate(requests):
    checker.resolve(index, request)
  with decode_records.CompletionWriter(options.get("decode_out"), invocation.job_dir,
                                       invocation.shown_job_dir) as writer:
    with jitted.activated():
      params = jitted.restore_params(checkpointer, step)
    generator = generation.Generator(setup, params, mesh=jitted.mesh, vocabulary=vocabulary,
                                     checkpoint_step=step, steps=steps)
    del params
    in_order = _InOrder(writer)
    started = time.perf_counter()
    try:
      with _sigterm_interrupts():
        completions = generator.generate(requests, on_completion=in_order.add)
    except KeyboardInterrupt:
      writer.close(succeeded=False)
      shown_path = options.get("decode_out") or (
          None if writer.path is None else shown / "decode" / writer.path.name)
      where = "on stdout" if to_stdout else f"in {shown_path}.partial"
      kept = f"; the {writer.count} written are {where}" if writer.count else ""
      raise ProgramFailure(f"decode interrupted after {len(in_order.done)} of {len(requests)} "
                           f"completions{kept}") from None
    seconds = time.perf_counter() - started
  tokens = sum(len(c.completion_ids) for c in completions)
  where = "stdout" if to_stdout else (
      options.get("decode_out") or shown / "decode" / writer.path.name)
  say(f"decoded {len(completions)} prompt(s) with checkpoint step {step}: {tokens} tokens in "
      f"{seconds:.2f} s ({tokens / max(seconds, 1e-9):,.0f} tokens/s, compiles included); "
      f"written to {where}")
  logging.info("decode: prefill buckets used %s", sorted(generator.compiled_prefill_buckets))
