"""Restoring a checkpoint step, checked: its files against their checksums, its tree against the
state's, its step counter against its folder's name; a refusal's advice names the way out (the
newest earlier step that passes the same checks). A mixin of `manager.Checkpointer`, reading the
record of verified and sound steps it keeps.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from lingvo_lite.checkpoints import integrity as checkpoint_integrity
from lingvo_lite.checkpoints import saved_state
from lingvo_lite.checkpoints.orbax_errors import READ_ERRORS, caused_by, innermost_cause
from lingvo_lite.errors import UsageError

ITEM = "default"  # The folder orbax writes a single-item step's state to.
_PARAMS = "params"  # The TrainState field a params-only restore reads; orbax keys it so.


class Restoring:
  """`Checkpointer`'s restores and their checks (its `_directory`, `_manager`, `_settings`,
  `_verified_steps`, `_sound` and step listings are read; none is made here)."""

  def metadata(self, step: int) -> dict[str, Any]:
    """The metadata saved with `step` ({} if none), once the step's files are verified."""
    self._verify(step)
    with self._reading(step):
      return dict(self._manager.metadata(step).custom_metadata or {})

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores `step` into the shapes, dtypes and shardings of `abstract_state`, after
    checking its files against their checksums and its tree against the state's, and then
    its step counter against the folder's name (UsageError naming the first file, parameter
    or step that differs)."""
    self._verify(step)
    self._check_tree(step, abstract_state, dtypes=True)
    with self._reading(step):
      restored = saved_state.from_disk(self._manager.restore(
          step, args=ocp.args.StandardRestore(saved_state.on_disk(abstract_state))),
          abstract_state)
    self._check_counter(step, saved_state.counter(restored))
    self._sound.add(step)
    return restored

  def restore_params(self, step: int, abstract_params: Any, fix: str | None = None) -> Any:
    """Restores only the parameters of the TrainState saved at `step`, into the shapes,
    dtypes and shardings of `abstract_params`; returns the plain parameter tree.

    The optimizer state is skipped on disk: no array of it is read or allocated. The same
    checks as `restore` come first: the step's checksums (over all its files: orbax packs
    parameters and moments into shared data files), then the saved parameters' tree against
    `abstract_params`; the step counter, read with them, last. `fix` replaces the advice of a
    tree that does not fit (a warm start's is not a resume's).
    """
    self._verify(step)
    wanted = {_PARAMS: abstract_params}
    self._check_tree(step, wanted, subtree=_PARAMS, fix=fix)
    with self._reading(step):
      restored = saved_state.partial_restore(self._directory / str(step) / ITEM,
                                             {**wanted, **self._counter_placeholder(step)})
    self._check_counter(step, saved_state.counter(restored))
    self._sound.add(step)
    return restored[_PARAMS]

  def _counter_placeholder(self, step: int) -> dict[str, np.ndarray]:
    return saved_state.counter_placeholder(self._manager.item_metadata(step))

  def _check_counter(self, step: int, counter: int | None) -> None:
    """The state's step counter must be the folder's step: a folder copied or renamed from
    another step's is refused as damaged, whatever its checksums say (a record written
    before records named their step cannot tell)."""
    problem = saved_state.counter_problem(step, counter)
    if problem is not None:
      raise UsageError(f"checkpoint step {step} is damaged: {problem}; {self._way_out(step)}")

  @contextlib.contextmanager
  def _reading(self, step: int) -> Iterator[None]:
    """orbax's errors reading a damaged step (checksums off, or damage they cannot see:
    a file edited before they were written) as one line naming the step and the way out."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      # orbax wraps tensorstore's read errors (a truncated data file) in a bare Exception
      # ("Encountered error while reading array index"), so the chain's causes decide.
      if not caused_by(e, READ_ERRORS):
        raise
      raise UsageError(f"checkpoint step {step} in {self._directory} is unreadable "
                       f"({innermost_cause(e)}); {self._way_out(step)}") from None

  def _check_tree(self, step: int, abstract_state: Any, subtree: str | None = None,
                  fix: str | None = None, dtypes: bool = False) -> None:
    """The saved arrays' paths and shapes (and, with `dtypes`, dtypes: a whole state's) must
    be the state's (saved_state.misfit)."""
    with self._reading(step):
      problem = saved_state.misfit(self._manager.item_metadata(step), abstract_state, subtree,
                                   dtypes)
    if problem:
      differs = "model" if subtree else "model or optimizer"  # A params read skips the rest.
      fix = fix or ("use the job's own config (its config.json), or a new --job_log_dir")
      raise UsageError(f"checkpoint step {step} in {self._directory} does not fit this config: "
                       f"{problem}; the {differs} differs from the one that wrote it: {fix}")

  def _verify(self, step: int) -> None:
    """Process 0 checks the files; every process learns the verdict, so all stop together."""
    if step in self._verified_steps:
      return
    problem = self._files_problem(step)
    if problem is not None:
      raise UsageError(f"checkpoint step {step} is {problem}; {self._way_out(step)}")
    if self._settings.checksums:
      self._verified_steps.add(step)

  def _files_problem(self, step: int) -> str | None:
    """What is wrong with `step`'s files by its checksums, as process 0 finds it and every
    process learns it (`_files_problem_here`); None where nothing is, or checksums are off."""
    if not self._settings.checksums:
      return None
    problem = None
    if jax.process_index() == 0:
      if checkpoint_integrity.has_checksums(self._directory / str(step)):
        problem = self._files_problem_here(step)
      else:
        self._warn_once("restoring unverified", step, "restoring checkpoint step %d without "
                        "checksums (checkpoint.restore_unverified)", step)
    if jax.process_count() > 1:
      bad = multihost_utils.broadcast_one_to_all(np.int32(problem is not None))
      if bad and problem is None:
        problem = "corrupt: process 0 found a file that differs from its checksum"
    return problem

  def _files_problem_here(self, step: int) -> str | None:
    """`damaged: ...` (the checksums were recorded for another step), `corrupt: ...` (a file
    differs from them), `unreadable: ...` (a file cannot be read: no permission, an I/O
    error) or None (no checksums, or nothing differs), by this process alone."""
    step_dir = self._directory / str(step)
    if not checkpoint_integrity.has_checksums(step_dir):
      return None
    other = checkpoint_integrity.step_mismatch(step_dir, step)
    if other is not None:
      return f"damaged: {other}"
    mismatch = checkpoint_integrity.first_mismatch(step_dir)
    if mismatch is None:
      return None
    unreadable = f" {checkpoint_integrity.CANNOT_BE_READ} (" in mismatch
    return f"{'unreadable' if unreadable else 'corrupt'}: {mismatch}"

  def sound(self, step: int) -> bool:
    """Whether `step` passes every check a restore makes of it (usable, its files, its step
    counter, read alone), short of restoring it: for the advice that names a step to resume
    from. Reads the step's files, by this process alone: meant for failure paths."""
    if step not in self.all_steps():
      return False
    if step in self._sound:
      return True
    if step in self.skipped_steps():
      return False
    if self._settings.checksums and self._files_problem_here(step) is not None:
      return False
    try:
      counter = saved_state.read_counter(self._directory / str(step) / ITEM,
                                         self._manager.item_metadata(step))
    except Exception as e:  # pylint: disable=broad-except
      if not caused_by(e, READ_ERRORS):
        raise
      return False  # Unreadable.
    if saved_state.counter_problem(step, counter) is not None:
      return False
    self._sound.add(step)
    return True

  def _way_out(self, step: int) -> str:
    """The advice of a refused step: move it away (and the earlier steps that fail the same
    checks), to resume from the newest earlier step that passes them, or to start over."""
    doomed, earlier = [step], None
    # Not the skipped steps: a restore never picks those, so they need not move.
    for candidate in reversed([s for s in self.usable_steps() if s < step]):
      if self.sound(candidate):
        earlier = candidate
        break
      doomed.append(candidate)
    folders = [str(self._directory / str(s)) for s in doomed]
    listed = folders[0] if len(folders) == 1 else (
        f"{', '.join(folders[:-1])} and {folders[-1]}")
    return (f"move {listed} out of the way to resume from step {earlier}"
            if earlier is not None else f"move {listed} out of the way to start from scratch")
