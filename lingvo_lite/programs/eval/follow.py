"""`--eval_continuous`: each checkpoint of a training run beside this one (this machine or
another) evaluated once, oldest first, as it lands; done after the run's final step, or once
the trainer has written nothing for `--eval_timeout_seconds`.

Process 0 decides (the step, and which sets it lacks) and every process follows
(agreement.py): a multi-process eval restores and evaluates together. A step still being
written or not yet verified is not usable (orbax keeps a step out of sight until it is whole;
its checksums follow at the trainer's next step); one whose restore failed is tried again later.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

from absl import logging
from etils import epath

from lingvo_lite.checkpoints import selection as checkpoint_selection
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.config import files as config_files
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup
from lingvo_lite.programs.eval.agreement import STOP, WAIT, RestoreFailed, agree
from lingvo_lite.programs.eval.record import EvalRecord
from lingvo_lite.runtime import summaries

# Longer than any wait between checkpoints worth polling for (time.sleep refuses inf).
MAX_POLL_SECONDS = 24 * 3600

Evaluate = Callable[[Checkpointer, int, list[str]], None]
# What a poll ends with: following is over; a step was tried (look again at once); none is due.
_DONE, _AGAIN, _SLEEP = "done", "again", "sleep"


def follow(setup: Setup, checkpoint_dir: epath.Path, record: EvalRecord, sets: list[str],
           evaluate: Evaluate, timeout_seconds: float, poll_seconds: float,
           is_chief: bool) -> None:
  """Evaluates each new checkpoint once, oldest first, until the run's final step is done or
  the trainer has written nothing for `timeout_seconds` (see the module doc)."""
  follower = _Follower(setup, checkpoint_dir, record, sets, evaluate, timeout_seconds,
                       poll_seconds, is_chief)
  summaries.log(f"waiting for checkpoints in {checkpoint_dir} (until step "
                f"{follower.final_step}, or {timeout_seconds:g} s without a new one)", is_chief)
  try:
    while (outcome := follower.poll()) != _DONE:
      if outcome == _SLEEP:
        time.sleep(poll_seconds)
  finally:
    if follower.checkpointer is not None:
      follower.checkpointer.close()


class _Follower:
  """What following a run keeps between polls: the checkpoint manager, the steps seen, the
  failed restores and when, the warnings given."""

  def __init__(self, setup: Setup, checkpoint_dir: epath.Path, record: EvalRecord,
               sets: list[str], evaluate: Evaluate, timeout_seconds: float,
               poll_seconds: float, is_chief: bool):
    self.setup, self.checkpoint_dir, self.record, self.sets = setup, checkpoint_dir, record, sets
    self.evaluate, self.timeout_seconds, self.is_chief = evaluate, timeout_seconds, is_chief
    self.job_dir = checkpoint_dir.parent
    self.final_step = _trainer_steps(self.job_dir, setup.train.steps)
    self.retry_seconds = max(10 * poll_seconds, 30.0)
    self.checkpointer: Checkpointer | None = None
    self.warned: set[tuple[int, str]] = set()
    self.seen: set[int] = set()
    self.failed: dict[int, float] = {}  # Step -> when its restore last failed.
    self.started = self.last_evaluation = time.time()

  def poll(self) -> str:
    """One look: evaluates the step due, if any (_AGAIN); _DONE when following is over;
    _SLEEP when nothing is due."""
    # Every process opens and re-reads the checkpoint manager at the same point: orbax
    # synchronizes the processes in those calls.
    if self.checkpointer is None and agree([int(self.checkpoint_dir.exists())])[0]:
      self.checkpointer = checkpoint_selection.open_existing(self.checkpoint_dir,
                                                             self.setup.checkpoint)
    choice, *wanted = agree(self._choice())
    if choice == STOP:
      summaries.log(f"evaluated the final step {self.final_step}; done", self.is_chief)
      return _DONE
    if choice >= 0:
      self._evaluate(choice, [name for name, want in zip(self.sets, wanted) if want])
      return _AGAIN
    return _DONE if self._timed_out() else _SLEEP

  def _choice(self) -> list[int]:
    """Process 0's [step or STOP or WAIT, then per set whether the step lacks it]."""
    choice, wanted = WAIT, [0] * len(self.sets)
    if self.checkpointer is None:
      return [choice, *wanted]
    try:
      self.checkpointer.refresh()
      if self.is_chief:
        self.final_step = _trainer_steps(self.job_dir, self.final_step)
        now = time.time()
        retry = {step for step, when in self.failed.items() if now - when < self.retry_seconds}
        choice = _next_step(self.checkpointer, self.record, self.sets, self.seen, self.warned,
                            self.final_step, retry)
    except OSError as e:  # The trainer deleted a step while it was listed.
      logging.warning("listing %s failed (%s); looking again", self.checkpoint_dir, e)
    if choice >= 0:  # The sets this step lacks.
      wanted = [int(not self.record.has(choice, name)) for name in self.sets]
    return [choice, *wanted]

  def _evaluate(self, step: int, names: list[str]) -> None:
    try:
      self.evaluate(self.checkpointer, step, names)
      self.failed.pop(step, None)
      self.last_evaluation = time.time()
    except RestoreFailed as e:
      # Damaged, or deleted by the trainer's retention mid-restore: newer steps go first,
      # this one is tried again after `retry_seconds`.
      self.failed[step] = time.time()
      if (step, str(e)) not in self.warned:
        self.warned.add((step, str(e)))
        logging.warning("skipping checkpoint step %d for now: %s", step, e)

  def _timed_out(self) -> bool:
    quiet = time.time() - max(_last_write(self.job_dir), self.last_evaluation, self.started)
    if not agree([int(quiet > self.timeout_seconds)])[0]:
      return False
    record = self.record
    done = [s for s in record.sets if not record.missing(s, self.sets)]
    summaries.log(f"stopping: the trainer wrote nothing in {self.job_dir} for "
                  f"{self.timeout_seconds:g} s (--eval_timeout_seconds) and its final step "
                  f"{self.final_step} was not evaluated; last evaluated step: "
                  f"{max(done) if done else 'none'}", self.is_chief)
    return True


def _next_step(checkpointer: Checkpointer, record: EvalRecord, sets: list[str], seen: set[int],
               warned: set[tuple[int, str]], final_step: int, retry_later: set[int]) -> int:
  """The oldest usable step not yet evaluated on every set (and not in `retry_later`); STOP
  once the final step is, WAIT when nothing is due."""
  skipped = checkpointer.skipped_steps()
  usable = [s for s in checkpointer.all_steps() if s not in skipped]
  for step in sorted(seen - set(usable)):
    if record.missing(step, sets) and (step, "gone") not in warned:
      warned.add((step, "gone"))
      logging.warning("checkpoint step %d was deleted before it was evaluated (the trainer's "
                      "checkpoint.max_to_keep); evaluating the ones that remain", step)
  seen.update(usable)
  for step in usable:
    if record.missing(step, sets) and step not in retry_later:
      return step
  if any(step >= final_step and not record.missing(step, sets) for step in record.sets):
    return STOP
  return WAIT


def _trainer_steps(job_dir: epath.Path, default: int) -> int:
  """`train.steps` of the job's own config.json: the trainer's final step, which a resumed run
  may have raised, and which an eval command's `--exp` need not repeat. `default` where the
  file cannot be read. Read again only when the file changes."""
  path = job_dir / config_files.CONFIG_JSON
  try:
    stat = path.stat()
    return _config_steps(str(path), stat.mtime, stat.length)
  except (OSError, UsageError, AttributeError, TypeError, ValueError):
    return default


@functools.lru_cache(maxsize=4)
def _config_steps(path: str, mtime: float, length: int) -> int:
  del mtime, length  # The cache key: a rewritten file is read again.
  return int(config_files.load(epath.Path(path)).train.steps)


def _last_write(job_dir: epath.Path) -> float:
  """When the trainer last wrote anything eval waits for: a checkpoint folder (orbax's
  temporary ones included) or a metrics row."""
  times = [0.0]
  for path in (job_dir / "checkpoints", job_dir / "metrics.jsonl"):
    try:
      times.append(path.stat().mtime)
      if path.is_dir():
        times += [child.stat().mtime for child in path.iterdir()]
    except OSError:
      continue  # Not there (yet), or deleted between the listing and the stat.
  return max(times)
