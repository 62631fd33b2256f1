"""A warm start from another lingvo_lite job's checkpoint: its parameters, on this mesh.

`JobCheckpoint(job_log_dir, step)` names a step of another job (None: its newest usable one).
Its parameters are restored alone (checkpoints/params.py: no optimizer state is read), into
this model's layer layout and shardings, whatever mesh and device count the other job
trained on; the optimizer starts fresh. The source's shapes must be this model's: a model
that differs is refused in one line, before anything is written.

Where training starts (the train program's `_restore_or_init`), in this order:
  1. the job's own newest verified checkpoint, when it has one: a resumed run, warm-started
     or not, continues from its own steps and never loads the source again;
  2. else `train.init_from`, the source's parameters at step 0 with a fresh optimizer;
  3. else a fresh initialization from `train.seed`.

`fingerprint` names what was loaded: the step's recorded checksums (every file's size and
CRC-32, checkpoints/integrity.py) hashed, so run_info.jsonl and the log say exactly which
weights a run started from.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from etils import epath

from lingvo_lite import paths
from lingvo_lite.checkpoints import integrity, selection
from lingvo_lite.checkpoints.manager import CheckpointSettings
from lingvo_lite.errors import UsageError
from lingvo_lite.fields import NonNegativeInt
from lingvo_lite.weights.weight_source import Source

FIELD = "train.init_from"


@dataclasses.dataclass(frozen=True)
class JobCheckpoint(Source):
  """Parameters from a step of another job's checkpoints.

  Attributes:
    job_log_dir: The job whose `checkpoints/` holds the step (relative to the working
      directory, like --job_log_dir).
    step: The step to load; None: the job's newest usable (verified) step.
  """

  job_log_dir: str
  step: NonNegativeInt | None = None

  def __post_init__(self):
    if not isinstance(self.job_log_dir, str) or not self.job_log_dir.strip():
      raise UsageError(f"job_log_dir={self.job_log_dir!r}: must name a job folder; give the "
                       "folder another run trained in")

  def describe(self) -> str:
    return f"{self.job_log_dir}@{self.step if self.step is not None else 'newest'}"

  def chosen_step(self) -> tuple[Any, epath.Path, int]:
    """(a reader of the source's checkpoints, their folder, the step to load).

    Raises:
      UsageError: no such job folder, no usable checkpoint in it, or no such step.
    """
    job = paths.resolve(self.job_log_dir, f"{FIELD}.job_log_dir")
    if not job.is_dir():
      raise UsageError(f"{FIELD}.job_log_dir={self.job_log_dir}: no such folder; give the "
                       "job folder of a run that saved checkpoints")
    checkpoint_dir = job / "checkpoints"
    checkpointer = selection.open_existing(checkpoint_dir, CheckpointSettings())
    step = selection.chosen_step(checkpointer, checkpoint_dir, self.step,
                                 epath.Path(self.job_log_dir),
                                 step_name=f"{FIELD}.step", job_name=f"{FIELD}.job_log_dir")
    return checkpointer, checkpoint_dir, step

  def load_params(self, mesh_params: Any) -> tuple[Any, str]:
    """(the source step's parameters restored into `mesh_params` (a
    `checkpoints.params.MeshParams`: the model, its shapes, shardings and layer layout), what
    was loaded as `JOB@STEP sha256:<digest of its checksums>`).

    Raises:
      UsageError: see `chosen_step`; the step fails its checksums, or its parameters do not
        fit this model (named as this field's, in one line).
    """
    checkpointer, checkpoint_dir, step = self.chosen_step()
    try:
      params = mesh_params.restore(
          checkpointer, step, fix=f"give {FIELD} a job of this model's shapes, or set the "
          "model to the source's (its job's config.json)")
    except UsageError as e:
      raise UsageError(f"{FIELD}={self.job_log_dir}@{step}: {e}") from None
    return params, f"{self.job_log_dir}@{step} {fingerprint(checkpoint_dir / str(step))}"


def flag_arguments(value: str, flag: str = "--init_from") -> dict[str, Any]:
  """`JobCheckpoint`'s arguments for `--init_from=JOB[@STEP]` (a trailing `@digits` is the
  step; any other `@` belongs to the path).

  Raises:
    UsageError: an empty value.
  """
  if not value.strip():
    raise UsageError(f"{flag}=: give JOB or JOB@STEP (another job's folder and step), or "
                     "hf:PATH (a Hugging Face folder)")
  job, at, step = value.rpartition("@")
  if at and job and step.isdigit():
    return {"job_log_dir": job, "step": int(step)}
  return {"job_log_dir": value, "step": None}


def fingerprint(step_dir: epath.Path) -> str:
  """`sha256:<hex>` of a step's recorded checksums (every file's size and CRC-32)."""
  recorded = step_dir / integrity.CHECKSUMS_FILE
  data = recorded.read_bytes() if recorded.exists() else b""
  return "sha256:" + hashlib.sha256(data).hexdigest()
