"""What a training run removes from JOB/checkpoints/, and what it moves aside instead.

A run removes only what the program itself wrote: old steps (`checkpoint.max_to_keep`,
`delete_step`), what its own failed saves left (`remove_failed_saves`), and what an earlier
run left half done: orbax's temporary folders (`N.orbax-checkpoint-tmp...`, a save that a kill
interrupted) and interrupted deletes (`N.lingvo_lite-deleting-T`). Anything else in the way of
a run is moved aside, never removed (`tidy_for_training`): a complete step a restore skipped
(no checksums) or newer than the restored one, an incomplete step folder (no orbax metadata: a
partial copy), a file where a step folder belongs (orbax would save over it). A set-aside entry
is renamed `N.unverified-T`, out of orbax's sight, where the user can look at it, rename it
back, or delete it; it is never touched again. Everything else (a folder or file of another
name) is left alone.

A step folder older than the one a run resumes from is kept where it is, but never in silence
when it is not the job's own (a copy from another job, a record of an older version's form or
of another step: integrity.not_own) or fails a quick check of its files (every recorded file
there with its size; CRC-32s are checked when a step is restored): one warning line each at
the start (`warn_of_older_steps`), and one line when retention keeps such steps (`warn_kept`).
No restore picks it while a newer good step exists, and retention never deletes a step that
is not the job's own.
"""

from __future__ import annotations

import time
from typing import Collection, Mapping

from absl import logging
from etils import epath

from lingvo_lite.checkpoints import integrity

# Folder-name markers of steps being written (orbax's) or being deleted (ours).
TEMPORARY_MARKERS = (".orbax-checkpoint-tmp", ".lingvo_lite-deleting")
SET_ASIDE_MARKER = ".unverified"  # An entry moved aside, kept out of orbax's sight.


def step_of(name: str) -> int | None:
  """The step a folder of this name holds for orbax (`57`), else None."""
  return int(name) if name.isdigit() and str(int(name)) == name else None


def temporary_folders(directory: epath.Path) -> list[epath.Path]:
  """Folders no run will finish (orbax's temporaries and interrupted deletes, left by a kill
  or a failed save): folders only, and never an entry already set aside."""
  return sorted(path for path in directory.iterdir()
                if SET_ASIDE_MARKER not in path.name and path.is_dir()
                and any(marker in path.name for marker in TEMPORARY_MARKERS))


def set_aside(path: epath.Path, why: str) -> epath.Path:
  """Renames `path` to `<name>.unverified-<ns>` beside it, with one warning saying why."""
  aside = path.parent / f"{path.name}{SET_ASIDE_MARKER}-{time.time_ns()}"
  logging.warning("%s; moved it to %s", why, aside)
  path.rename(aside)
  return aside


def tidy_for_training(directory: epath.Path, start: int | None, step_folders: Collection[int],
                      skipped: Mapping[int, str], pending: Collection[int]) -> list[int]:
  """Before a training run saves its first step: removes the temporary folders and moves
  aside what is in the way of the steps the run will save (see the module doc). One warning
  line per entry.

  Args:
    directory: The checkpoints folder.
    start: The step the run restored (None: it starts over).
    step_folders: The step folders orbax lists.
    skipped: Those a restore would not use, with the reason (Checkpointer.skipped_steps).
    pending: This run's own saves, still being written: left alone.

  Returns:
    The steps whose folders were moved aside.
  """
  resumed = f"training resumes from step {start}" if start else "training starts over"
  for path in temporary_folders(directory):
    logging.warning("removing %s, left by an interrupted save or delete", path)
    path.rmtree()
  for path in sorted(directory.iterdir()):
    if SET_ASIDE_MARKER in path.name or path.is_dir():
      continue
    if step_of(path.name) is not None or any(m in path.name for m in TEMPORARY_MARKERS):
      # Not written by this program (its steps and temporaries are folders); orbax would
      # save over a file named like a step.
      set_aside(path, f"{path} is a file where orbax keeps a checkpoint folder; {resumed}")
  moved = []
  for step in sorted(step_folders):
    if step in pending or (step not in skipped and step <= (start or 0)):
      continue
    reason = skipped.get(step, f"step {step} is newer than the restored one")
    # Kept, not deleted: the user may still want it (rename it back; a complete step without
    # checksums restores with checkpoint.restore_unverified).
    set_aside(directory / str(step), f"checkpoint {reason}; {resumed}")
    moved.append(step)
  return moved


def warn_of_older_steps(directory: epath.Path, start: int, usable: Collection[int],
                        job: str) -> list[int]:
  """Warns (one line each) of the usable step folders older than `start` that are not job
  `job`'s own or fail a quick check of their files (see the module doc); returns them."""
  warned = []
  for step in sorted(s for s in usable if s < start):
    step_dir = directory / str(step)
    not_own = integrity.not_own(step_dir, step, job)
    problem = not_own or integrity.first_mismatch(step_dir, contents=False)
    if problem is None:
      continue
    keeps = ("neither uses nor deletes it" if not_own else "does not use it")
    logging.warning("checkpoint step %d (%s) is %s: %s; training resumes from step %d and %s: "
                    "move it out of %s (or delete it) once you no longer need it", step,
                    step_dir, "not this job's own" if not_own else "damaged", problem, start,
                    keeps, directory)
    warned.append(step)
  return warned


def warn_kept(directory: epath.Path, kept: Mapping[int, str], rule: str) -> None:
  """One warning line: retention (`rule`) keeps the older steps `kept` ({step: why it is not
  the job's own}), which it deletes none of."""
  steps = sorted(kept)
  listed = (f"step {steps[0]}" if len(steps) == 1 else
            f"steps {', '.join(map(str, steps[:-1]))} and {steps[-1]}")
  them = "them" if len(steps) > 1 else "it"
  reasons = "; ".join(f"step {step}: {kept[step]}" for step in steps)
  logging.warning("%s keeps %s in %s: not this job's own (%s), and retention deletes only the "
                  "job's own steps: move %s out (or delete %s) once you no longer need %s",
                  rule, listed, directory, reasons, them, them, them)


def delete_step(directory: epath.Path, step: int, why: str) -> None:
  """Deletes a step folder of this job's (one warning line): renamed out of orbax's sight
  first, so a kill mid-delete leaves an interrupted delete that the next run removes, never a
  half step."""
  doomed = directory / f"{step}{TEMPORARY_MARKERS[1]}-{time.time_ns()}"
  logging.warning("deleting checkpoint step %d: %s", step, why)
  (directory / str(step)).rename(doomed)
  doomed.rmtree()


def remove_failed_saves(directory: epath.Path, unverified_steps: Collection[int]) -> None:
  """After a run's save failed: removes orbax's temporary folders (a full disk stopped the
  copy) and the steps the run wrote but could not verify (their checksums could not be
  written). A failure to is a warning: the run's own failure is the one to report, and the
  next run retries."""
  for path in temporary_folders(directory) + [directory / str(s) for s in unverified_steps]:
    try:
      path.rmtree()
    except OSError as e:
      logging.warning("could not remove %s, left by a failed save: %s", path, e)
