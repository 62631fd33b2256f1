"""The generator: requests in, completions out, over a fixed set of slots that refill.

Host side of decoding (lingvo_lite/decode/steps.py holds the jitted steps). A request is
resolved first (its settings from the config's `decode.*` defaults, its prompt tokenized,
its length checked against the cache), so every bad request is one line before any device
time. Then, while requests remain:

  1. free slots take the next requests: one prefill call writes their prompts (padded to
     the smallest prefill bucket that holds the longest) and samples their first tokens;
  2. one generate call runs every slot for up to `decode.steps_per_call` tokens;
  3. the host reads the slots' tokens back, matches stop strings on the detokenized text,
     and turns each finished slot into a Completion, freeing the slot.

The functions are compiled once per (slots, cache length) and once per prefill bucket:
settings, prompt lengths within a bucket and the number of requests change no shape.

`SlotBatch` is those steps one round at a time: `generate` runs one batch to the end, and the
server's engine (serving/engine.py) keeps one open, adding and cancelling requests between
rounds (continuous batching).

A request is resolved by request_resolver.py (its settings, its prompt as ids, whether it fits
the cache), which needs no device.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from lingvo_lite.decode import sampling, steps as decoding
from lingvo_lite.decode.jitted import DecodeSteps, end_token
from lingvo_lite.decode.records import Completion
from lingvo_lite.decode.request_resolver import RequestResolver, Resolved
from lingvo_lite.decode.requests import Request
from lingvo_lite.experiment import Setup


@dataclasses.dataclass
class _Slot:
  """A request being decoded in one slot."""

  job: Resolved
  started: float
  first_token: float
  checked: int = 0  # Completion tokens already searched for stop strings.


class Generator:
  """Decodes requests with one Setup's model and parameters (see the module doc).

  Attributes:
    compiled_prefill_buckets: The prefill buckets used so far (each compiled once).
  """

  def __init__(self, setup: Setup, params: Any, mesh: Mesh | None = None,
               vocabulary: Any = None, checkpoint_step: int | None = None,
               steps: DecodeSteps | None = None):
    """
    Args:
      setup: The validated Setup (its model and `decode` settings are used).
      params: The model's parameters (placed into their shardings on `mesh`).
      mesh: The device mesh; None makes the partitioner's over this host's devices.
      vocabulary: The seqio vocabulary for text prompts and completions; None decodes ids.
      checkpoint_step: Recorded in each completion.
      steps: The jitted functions, if already made for this setup, mesh and vocabulary.
    """
    self.setup = setup
    self.settings = setup.decode
    self.vocabulary = vocabulary
    self.checkpoint_step = checkpoint_step
    eos_id = end_token(setup, vocabulary)
    self.steps = steps or DecodeSteps(setup, mesh, eos_id)
    # The model `params` fit: the decode functions' (the setup's, or on an accelerator its
    # scanned layers unrolled, `LanguageModel.for_decoding`), so applying one to the other
    # holds on every backend.
    self.model = self.steps.model
    self.resolver = RequestResolver(setup, vocabulary)
    self.eos_id = eos_id
    self.slots = self.steps.slots
    self.cache_length = self.steps.cache_length
    self.params = self.steps.decode_form(params)
    self.state = self.steps.empty_state()
    self.compiled_prefill_buckets: set[int] = set()
    self._prefill: dict[int, Any] = {}  # Bucket -> compiled prefill.
    self._generate: Any = None  # The compiled generate loop.

  def activated(self):
    return self.steps.activated()

  # --------------------------------------------------------------------------- decoding

  def warm(self, prompt_lengths: Sequence[int]) -> None:
    """Compiles the generate loop and the prefill of every bucket these prompt lengths use
    (ahead of time, from shapes), so no request's timing counts a compile; the generator
    then calls these executables."""
    buckets = {self.settings.bucket_for(n, self.model.max_length) for n in prompt_lengths}
    for bucket in sorted(buckets - set(self._prefill)):
      self._prefill[bucket] = self.steps.lower_prefill(bucket).compile()
    if self._generate is None:
      self._generate = self.steps.lower_generate().compile()

  def generate(self, requests: Sequence[Request],
               on_completion: Callable[[int, Completion], None] | None = None,
               should_stop: Callable[[], bool] | None = None) -> list[Completion | None]:
    """Completions of `requests`, in their order (all resolved, and the functions they need
    compiled, before any is decoded).

    Args:
      requests: What to decode.
      on_completion: Called with (request index, completion) as each one finishes (in the
        order they finish), so a caller can write results before the last is done.
      should_stop: Asked between device calls; True ends the decode early, the unfinished
        requests' entries None.
    """
    jobs = [self.resolver.resolve(index, request) for index, request in enumerate(requests)]
    self.warm([len(job.prompt_ids) for job in jobs])
    batch = SlotBatch(self)
    for job in jobs:
      batch.add(job)
    results: list[Completion | None] = [None] * len(jobs)
    with self.activated():
      while batch.busy and not (should_stop and should_stop()):
        for job, completion in batch.step().finished:
          results[job.index] = completion
          if on_completion is not None:
            on_completion(job.index, completion)
      batch.end_all()
    return results

  def _prefill_slots(self, chosen: list[tuple[int, Resolved]],
                     slots: list[_Slot | None]) -> None:
    """One prefill call for the jobs of `chosen` (slot, job); times it to the first token."""
    bucket = self.settings.bucket_for(max(len(job.prompt_ids) for _, job in chosen),
                                      self.model.max_length)
    prompts = np.zeros((self.slots, bucket), np.int32)
    prompt_lengths = np.ones(self.slots, np.int32)
    insert = np.zeros(self.slots, bool)
    end = np.zeros(self.slots, np.int32)
    temperature = np.zeros(self.slots, np.float32)
    top_k = np.zeros(self.slots, np.int32)
    top_p = np.ones(self.slots, np.float32)
    seeds = np.zeros((self.slots, 2), np.uint32)
    for slot, job in chosen:
      prompts[slot, :len(job.prompt_ids)] = job.prompt_ids
      prompt_lengths[slot] = len(job.prompt_ids)
      insert[slot] = True
      end[slot] = len(job.prompt_ids) + job.max_new_tokens
      temperature[slot], top_k[slot], top_p[slot] = job.temperature, job.top_k, job.top_p
      seeds[slot] = decoding.key_data(job.seed)
    started = time.perf_counter()
    self.state = self._prefill[bucket](
        self.params, self.state, prompts, prompt_lengths, insert, end,
        sampling.SamplingParams(temperature, top_k, top_p), seeds)
    jax.block_until_ready(self.state.lengths)
    first_token = time.perf_counter()
    self.compiled_prefill_buckets.add(bucket)
    for slot, job in chosen:
      slots[slot] = _Slot(job=job, started=started, first_token=first_token)

  def _finished(self, slot: _Slot, tokens: np.ndarray, logprobs: np.ndarray, length: int,
                done: bool, now: float) -> Completion | None:
    """The slot's Completion if it has ended (EOS, max_new_tokens or a stop string)."""
    job = slot.job
    start = len(job.prompt_ids)
    ids = [int(t) for t in tokens[start:length + 1]]
    reason, stop_string, text = None, None, None
    if job.stop and self.vocabulary is not None:
      stop_at = self._stop_match(slot, ids)
      if stop_at is not None:
        count, stop_string, text = stop_at
        ids, reason = ids[:count], "stop"
    if reason is None and not done:
      return None
    if reason is None:
      reason = "eos" if ids[-1] == self.eos_id else "max_new_tokens"
      text = self.resolver.completion_text(job.prompt_ids,
                                           ids[:-1] if reason == "eos" else ids)
    return Completion(
        request=job.request, prompt_ids=job.prompt_ids, prompt_text=job.prompt_text,
        completion_ids=tuple(ids), completion_text=text,
        logprobs=tuple(float(p) for p in logprobs[start:start + len(ids)]),
        stop_reason=reason, stop_string=stop_string, settings=job.settings,
        checkpoint_step=self.checkpoint_step,
        prefill_seconds=slot.first_token - slot.started,
        decode_seconds=max(0.0, now - slot.first_token))

  def _stop_match(self, slot: _Slot, ids: list[int]) -> tuple[int, str, str] | None:
    """(tokens up to the one that completed a stop string, the string, the completion's text
    cut before it) for the first stop string the completion's text contains, or None.

    The text is decoded once per call; only when it holds a stop string is the shortest
    prefix that does found, by bisection over the tokens since the last check (a longer
    prefix's text extends a shorter one's), so a long completion costs a few decodes per
    call, not one per token. Tokens after an EOS are not searched (the slot ended there).
    """
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    job = slot.job

    def first_stop(count: int) -> tuple[int, str, str] | None:
      text = self.resolver.completion_text(job.prompt_ids, ids[:count])
      found = [(text.find(stop), stop) for stop in job.stop if stop in text]
      return (count, min(found)[1], text[:min(found)[0]]) if found else None

    if first_stop(len(ids)) is None:
      slot.checked = len(ids)
      return None
    low, high = slot.checked, len(ids)  # first_stop(low) is None, first_stop(high) is not.
    while high - low > 1:
      middle = (low + high) // 2
      if first_stop(middle) is None:
        low = middle
      else:
        high = middle
    return first_stop(high)


@dataclasses.dataclass
class StepResult:
  """What one SlotBatch.step did.

  Attributes:
    finished: (job, completion) for each request that ended in it.
    running: (job, completion ids so far) for each request still in a slot.
  """

  finished: list[tuple[Resolved, Completion]]
  running: list[tuple[Resolved, list[int]]]


class SlotBatch:
  """The generator's slots over time: requests join as slots free up (continuous batching).

  `generate` runs one to completion; a server keeps one open, adding requests as they come
  and cancelling those whose clients left. Each `step` is one round: free slots take waiting
  requests (one prefill call), one generate call runs every slot for up to
  `decode.steps_per_call` tokens, and the slots that ended are freed. Call it with the
  generator's mesh active (`generator.activated()`), from one thread.
  """

  def __init__(self, generator: Generator):
    self.generator = generator
    self.pending: collections.deque[Resolved] = collections.deque()
    self.slots: list[_Slot | None] = [None] * generator.slots
    # Slots the host finished since the last call (a stop string, a cancel): the next call
    # marks them done on the device, so they do not run on.
    self.ended = np.zeros(generator.slots, bool)

  @property
  def busy(self) -> bool:
    return bool(self.pending) or any(slot is not None for slot in self.slots)

  def add(self, job: Resolved) -> None:
    """Queues a resolved request (RequestResolver.resolve); its prefill bucket must have been
    warmed, or is compiled at its first use."""
    self.pending.append(job)

  def cancel(self, job: Resolved) -> bool:
    """Drops `job`, waiting or in a slot (its slot is freed). False if it is not here."""
    for waiting in self.pending:
      if waiting is job:  # Identity: two requests alike are still two.
        self.pending.remove(waiting)
        return True
    for index, slot in enumerate(self.slots):
      if slot is not None and slot.job is job:
        self.slots[index] = None
        self.ended[index] = True
        return True
    return False

  def step(self) -> StepResult:
    generator = self.generator
    free = [index for index, slot in enumerate(self.slots) if slot is None]
    if free and self.pending:
      chosen = [(slot, self.pending.popleft()) for slot in free[:len(self.pending)]]
      generator.warm([len(job.prompt_ids) for _, job in chosen])
      generator._prefill_slots(chosen, self.slots)
      self.ended[[slot for slot, _ in chosen]] = False
    generator.state = generator._generate(
        generator.params, generator.state, np.int32(generator.settings.steps_per_call),
        self._take_ended())
    tokens, logprobs, lengths, done = jax.device_get(
        (generator.state.tokens, generator.state.logprobs, generator.state.lengths,
         generator.state.done))
    now = time.perf_counter()
    result = StepResult(finished=[], running=[])
    for index, slot in enumerate(self.slots):
      if slot is None:
        continue
      completion = generator._finished(
          slot, tokens[index], logprobs[index], int(lengths[index]), bool(done[index]), now)
      if completion is None:
        start = len(slot.job.prompt_ids)
        result.running.append((slot.job, [int(t) for t in tokens[index, start:
                                                                  int(lengths[index]) + 1]]))
        continue
      result.finished.append((slot.job, completion))
      self.slots[index] = None
      self.ended[index] = True
    return result

  def end_all(self) -> None:
    """Marks every slot done on the device (a zero-step call) and forgets what waits: what a
    stopped decode leaves, so the next batch starts from quiet slots."""
    generator = self.generator
    self.pending.clear()
    self.ended |= np.array([slot is not None for slot in self.slots])
    self.slots = [None] * generator.slots
    if self.ended.any():
      generator.state = generator._generate(
          generator.params, generator.state, np.int32(0), self._take_ended())

  def _take_ended(self) -> np.ndarray:
    """The slots ended since the last call, in an array of their own, and none left ended.
    A call may return before its host arrays have reached the device (the transfer can run
    asynchronously; JAX keeps the array alive, not unchanged), so clearing the very array it
    was given could reach the device first. The likely cause of a slot that a stop string
    ended left not done on the device (tests/decode/test_decode.py's stop-string test, twice
    under load; not reproduced in isolation)."""
    ended = self.ended.copy()
    self.ended[:] = False
    return ended
