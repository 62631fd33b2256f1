"""The serving engine: one thread that owns the device and runs the decode slots continuously.

Requests from any thread (the HTTP server's event loop) are resolved where they arrive (their
settings, prompt ids and length checked: a bad one is refused before it waits), then handed to
the engine thread, which loops:

  1. takes what arrived: new requests join the slot batch's queue, cancellations (a client that
     left, a timeout) free their slots, scoring jobs are collected;
  2. scores every collected sequence in one packed pass (scoring/scorer.py);
  3. runs one round of the slots (decode/generator.SlotBatch.step): free slots take waiting
     requests with one prefill, then every slot generates up to `decode.steps_per_call` tokens;
     a finished request's slot is free for the next round. A new request waits at most one
     round for its prefill, never for the batch to finish.

Each request reports through its callbacks, called on the engine thread: `on_tokens` with the
completion's ids so far after each round (for streaming), then `on_done` with the Completion, or
`on_error` with a message. Nothing a request does can stop the thread: an error in a round fails
the requests of that round and the engine goes on with a fresh batch.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import Any, Callable, Sequence

from absl import logging

from lingvo_lite.decode.generator import SlotBatch
from lingvo_lite.decode.requests import Request


class QueueFull(RuntimeError):
  """More requests are outstanding than the engine holds (the server answers 429)."""


@dataclasses.dataclass(eq=False)
class Ticket:
  """One request given to the engine; the handle to cancel it."""

  job: Any  # The resolved request (decode/request_resolver.Resolved).
  on_tokens: Callable[[list[int]], None] | None
  on_done: Callable[[Any], None]
  on_error: Callable[[str], None]


@dataclasses.dataclass(eq=False)
class _Scoring:
  sequences: list[list[int]]
  on_done: Callable[[list[Any]], None]
  on_error: Callable[[str], None]


class Engine:
  """See the module doc. Start with `start()`, end with `stop()`."""

  def __init__(self, model: Any, max_outstanding: int):
    """
    Args:
      model: The LoadedModel (serving/loaded_model.py) whose generator and scorer run here.
      max_outstanding: Most generation requests waiting or running at once; more are refused
        (QueueFull) rather than queued without bound.
    """
    self.model = model
    self.max_outstanding = max_outstanding
    self._lock = threading.Condition()
    self._arrived: list[Ticket] = []
    self._cancelled: list[Ticket] = []
    self._scoring: list[_Scoring] = []
    # Waiting or running, by id(ticket.job): how a round's jobs find their tickets.
    self._outstanding: dict[int, Ticket] = {}
    self._stopping = False
    self._ids = itertools.count()
    self._thread = threading.Thread(target=self._run, name="lingvo_lite-engine", daemon=True)
    self.rounds = 0

  # ------------------------------------------------------------------------ any thread

  def start(self) -> None:
    self._thread.start()

  def stop(self, timeout: float | None = None) -> None:
    """Fails what is still outstanding, ends the thread."""
    with self._lock:
      self._stopping = True
      self._lock.notify()
    if self._thread.ident is not None:  # Started.
      self._thread.join(timeout)

  @property
  def outstanding(self) -> int:
    with self._lock:
      return len(self._outstanding)

  def resolve(self, request: Request) -> Any:
    """The request with its settings decided and its prompt as ids (decode/generator.py).

    Raises:
      UsageError: it cannot be decoded (its prompt does not fit the cache, ...), one line.
    """
    return self.model.generator.resolver.resolve(next(self._ids), request)

  def submit(self, jobs: Sequence[Any], callbacks: Sequence[tuple]) -> list[Ticket]:
    """Queues resolved jobs, each with its (on_done, on_error, on_tokens or None), all
    together or none of them.

    Raises:
      QueueFull: they would make more than `max_outstanding` waiting or running.
    """
    tickets = [Ticket(job=job, on_done=done, on_error=error, on_tokens=tokens)
               for job, (done, error, tokens) in zip(jobs, callbacks)]
    with self._lock:
      if self._stopping:
        raise QueueFull("the server is shutting down")
      if len(self._outstanding) + len(tickets) > self.max_outstanding:
        raise QueueFull(f"{len(self._outstanding)} requests are outstanding, at most "
                        f"{self.max_outstanding} (--max_outstanding); retry later")
      self._outstanding.update((id(ticket.job), ticket) for ticket in tickets)
      self._arrived += tickets
      self._lock.notify()
    return tickets

  def cancel(self, ticket: Ticket) -> None:
    """Drops the request (waiting, or its slot); nothing more is reported for it."""
    with self._lock:
      if self._outstanding.get(id(ticket.job)) is ticket:
        del self._outstanding[id(ticket.job)]
        self._cancelled.append(ticket)
        self._lock.notify()

  def score(self, sequences: Sequence[Sequence[int]], on_done: Callable[[list[Any]], None],
            on_error: Callable[[str], None]) -> None:
    """Scores token sequences (scoring/scorer.Scores each) on the engine thread."""
    with self._lock:
      if self._stopping:
        raise QueueFull("the server is shutting down")
      self._scoring.append(_Scoring([list(s) for s in sequences], on_done, on_error))
      self._lock.notify()

  # ------------------------------------------------------------------------ engine thread

  def _run(self) -> None:
    generator = self.model.generator
    batch = SlotBatch(generator)
    with generator.activated():
      while True:
        with self._lock:
          while not (self._arrived or self._cancelled or self._scoring or batch.busy
                     or self._stopping):
            self._lock.wait()
          arrived, self._arrived = self._arrived, []
          cancelled, self._cancelled = self._cancelled, []
          scoring, self._scoring = self._scoring, []
          stopping = self._stopping
        for ticket in cancelled:
          batch.cancel(ticket.job)
        if stopping:
          self._fail_all(batch, scoring, "the server is shutting down")
          return
        for ticket in arrived:
          if self._ticket(ticket.job) is ticket:  # Not cancelled before it got here.
            batch.add(ticket.job)
        if scoring:
          self._score(scoring)
        if batch.busy:
          batch = self._round(batch)

  def _ticket(self, job: Any) -> Ticket | None:
    with self._lock:
      return self._outstanding.get(id(job))

  def _score(self, jobs: list[_Scoring]) -> None:
    try:
      scores = self.model.scorer.score([s for job in jobs for s in job.sequences])
    except Exception as e:  # pylint: disable=broad-except
      logging.exception("scoring failed")
      for job in jobs:
        job.on_error(f"scoring failed: {type(e).__name__}: {e}")
      return
    start = 0
    for job in jobs:
      job.on_done(scores[start:start + len(job.sequences)])
      start += len(job.sequences)

  def _round(self, batch: SlotBatch) -> SlotBatch:
    try:
      result = batch.step()
      self.rounds += 1
    except Exception as e:  # pylint: disable=broad-except
      logging.exception("a decode round failed")
      message = f"decoding failed: {type(e).__name__}: {e}"
      waiting = list(batch.pending) + [s.job for s in batch.slots if s is not None]
      for job in waiting:
        self._finish(job, error=message)
      return SlotBatch(self.model.generator)  # The failed round's state is not reused.
    for job, ids in result.running:
      ticket = self._ticket(job)
      if ticket is not None and ticket.on_tokens is not None:
        ticket.on_tokens(ids)
    for job, completion in result.finished:
      self._finish(job, completion=completion)
    return batch

  def _finish(self, job: Any, completion: Any = None, error: str | None = None) -> None:
    with self._lock:
      ticket = self._outstanding.pop(id(job), None)
    if ticket is None:
      return  # Cancelled meanwhile.
    if error is not None:
      ticket.on_error(error)
    else:
      ticket.on_done(completion)

  def _fail_all(self, batch: SlotBatch, scoring: list[_Scoring], message: str) -> None:
    for job in scoring:
      job.on_error(message)
    with self._lock:
      left, self._outstanding = list(self._outstanding.values()), {}
    for ticket in left:
      ticket.on_error(message)
    try:
      batch.end_all()
    except Exception:  # pylint: disable=broad-except
      logging.exception("ending the slots at shutdown failed")

