"""The parameters a program that does not train uses: the job's own checkpoint, else the
weight source its config starts from (`train.init_from`); `JobParams` opens them for every
program (eval, decode, serve, export, compile, the lm_eval harness).

A job dir whose config names a source (a Hugging Face folder, another job) and that has no
checkpoint of its own yet is that source's model: export, like train, reads the source's
parameters. A job with a checkpoint reads its own (its newest usable step, or the one asked
for); asking for a step of a job that has none is refused as before, naming the job.

What a program gets from `JobParams`: the step asked for checked, the mesh (the partitioner's,
over the target's devices), the parameters' shapes on it (`MeshParams`: their dtypes and
shardings, for any layer layout of the model), where they come from (`choose()`, made when
first asked, so a program checks its own arguments first), and the load. What the model does with
them (decoding's form of the weights, int8 quantized once: serving/loaded_model.py) is above.

A LoRA job (`train.lora`, models/lora.py) is its base (`train.init_from`) and its adapters (its
checkpoint; at step 0, a `peft:` source's, else none): `load()` gives the model's parameters
with the adapters merged into their kernels (W + alpha/r A B; for QLoRA over the int8 base
they were trained over), so decode, serve, eval, the harness and the hf/gguf/slim exports run
an adapter job as the model it computes; `load_adapters()` gives the adapters themselves (the
peft export). A base other than the one the checkpoint was trained over is refused, as a
resume refuses it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
from etils import epath

from lingvo_lite import target as targets
from lingvo_lite.checkpoints import selection as checkpoint_selection
from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.errors import UsageError
from lingvo_lite.models import lora
from lingvo_lite.weights import frozen_weights


@dataclasses.dataclass(frozen=True)
class ParamsChoice:
  """Where a program's parameters come from: the job's step `step`, else `source`.

  Attributes:
    checkpointer: The job's checkpoint manager (None where it has no checkpoints folder).
    step: The job's step to restore; None where the parameters come from `source`.
    source: The weight source (`train.init_from`) read instead of a checkpoint, or None.
    shown_job: The job dir as the user gave it, for messages.
  """
  checkpointer: Any
  step: int | None
  source: Any
  shown_job: Any

  def describe(self) -> str:
    """'checkpoint step N', or 'train.init_from gguf:PATH' (for summary lines)."""
    if self.step is not None:
      return f"checkpoint step {self.step}"
    return f"train.init_from {self.source.describe()}"


# (checkpointer, checkpoint folder, the step asked for or None, the job as shown) -> the step.
StepChooser = Callable[[Any, epath.Path, "int | None", Any], int]


def choose(setup: Any, job_dir: epath.Path, shown_job: Any, wanted_step: int | None,
           step_chooser: StepChooser | None = None) -> ParamsChoice:
  """The job's own checkpoint (its newest usable step, or `wanted_step`, as `step_chooser`
  picks it: checkpoints/selection.py's by default), else the config's `train.init_from`,
  checked before anything is read.

  Raises:
    UsageError: no usable checkpoint and no source, or the step asked for is not there.
  """
  checkpoint_dir = job_dir / "checkpoints"
  checkpointer = checkpoint_selection.open_existing(checkpoint_dir, setup.checkpoint)
  source = setup.train.init_from
  has_own = checkpointer is not None and checkpointer.latest_step(warn=False) is not None
  if has_own or wanted_step is not None or source is None:
    step = (step_chooser or checkpoint_selection.chosen_step)(
        checkpointer, checkpoint_dir, wanted_step, shown_job)
    return ParamsChoice(checkpointer, step, None, shown_job)
  return ParamsChoice(checkpointer, None, source, shown_job)


def load(choice: ParamsChoice, mesh_params: MeshParams) -> tuple[Any, str]:
  """(the chosen parameters in `mesh_params`' shardings, what they are).

  Raises:
    UsageError: the source cannot be read (one line).
  """
  if choice.step is not None:
    return (mesh_params.restore(choice.checkpointer, choice.step),
            f"step {choice.step} of {choice.shown_job}")
  params, loaded = choice.source.load_params(mesh_params)
  return params, f"{loaded} (train.init_from: {choice.shown_job} has no checkpoint yet)"


def mesh_of(setup: Any, devices: Sequence[jax.Device] | None = None) -> Any:
  """The mesh a job's parameters go to: its partitioner's, over `devices` (default: the
  active target's; a compile's are its topology's)."""
  return setup.partitioner.make_mesh(devices if devices is not None
                                     else targets.current().devices)


class JobParams:
  """A job's parameters as a program opens them (see the module doc).

  Attributes:
    setup: The job's Setup.
    job_dir: The job dir (resolved).
    shown_job: The job dir as the user gave it, for messages.
    mesh: Where the parameters go.
  """

  def __init__(self, setup: Any, job_dir: epath.Path, shown_job: Any = None,
               wanted_step: int | None = None, *, devices: Sequence[jax.Device] | None = None,
               mesh: Any = None, step_chooser: StepChooser | None = None):
    """
    Args:
      setup: The job's built Setup.
      job_dir: The job dir.
      shown_job: The job dir as given (default: `job_dir`).
      wanted_step: The checkpoint step asked for (None: the newest usable one).
      devices: The devices of the mesh (default: the active target's).
      mesh: The mesh itself, where the program has made it already.
      step_chooser: How a checkpoint step is picked (a program whose processes must agree
        gives its own).

    Raises:
      UsageError: `wanted_step` is not a step number.
    """
    checkpoint_selection.check_wanted(wanted_step)
    # These programs run no pipeline: the stacked layers replicated over a stage axis.
    self.setup = dataclasses.replace(setup, partitioner=setup.partitioner.without_stages())
    self.job_dir = job_dir
    self.shown_job = shown_job if shown_job is not None else job_dir
    self._wanted_step = wanted_step
    self._step_chooser = step_chooser
    self._devices = devices
    self._mesh = mesh
    self._choice: ParamsChoice | None = None

  @property
  def mesh(self) -> Any:
    """The mesh the parameters go to (`mesh_of`; made when first asked)."""
    if self._mesh is None:
      self._mesh = mesh_of(self.setup, self._devices)
    return self._mesh

  def choose(self) -> ParamsChoice:
    """Where the parameters come from, chosen once (when first asked).

    Raises:
      UsageError: no usable checkpoint and no source, or the step asked for is not there.
    """
    if self._choice is None:
      self._choice = choose(self.setup, self.job_dir, self.shown_job, self._wanted_step,
                            self._step_chooser)
    return self._choice

  @property
  def step(self) -> int | None:
    """The job's checkpoint step read, or None where the parameters are the source's."""
    return self.choose().step

  def describe(self) -> str:
    return self.choose().describe()

  def shapes(self, model: Any = None, abstract: Any = None) -> MeshParams:
    """The parameters of `model` (default: the Setup's; another layer layout of it, say) as
    shapes on the mesh (`abstract`: the caller's, where it has them already)."""
    setup = self.setup
    return MeshParams(model if model is not None else setup.model,
                      setup.train_data.sequence_length, setup.partitioner, self.mesh, abstract)

  def load(self, shapes: MeshParams | None = None) -> tuple[Any, str]:
    """(the parameters in `shapes`' shardings (default: `shapes()`), what they are); a LoRA
    job's with its adapters merged.

    Raises:
      UsageError: see `choice`; the source or the step cannot be read (one line).
    """
    shapes = shapes if shapes is not None else self.shapes()
    if self.setup.train.lora is None:
      return load(self.choose(), shapes)
    base, adapters, what = self._adapted(shapes)
    if adapters is None:
      return base, what
    scale = self.setup.train.lora.scale
    shardings = jax.tree.map(lambda leaf: leaf.sharding, shapes.abstract)
    merged = jax.jit(lambda params, adapters: lora.merge(params, adapters, scale),
                     out_shardings=shardings, donate_argnums=0)(base, adapters)
    return merged, what

  def load_adapters(self) -> tuple[Any, str]:
    """(a LoRA job's adapters, the `lora` tree of models/lora.py, what they are: its step's,
    or at step 0 its `peft:` source's).

    Raises:
      UsageError: the job has no LoRA adapters, or they cannot be read (one line).
    """
    if self.setup.train.lora is None:
      raise UsageError(f"--job_log_dir={self.shown_job}: the job trains no LoRA adapters "
                       "(train.lora is None); export it whole (--export_format=hf, slim)")
    _, adapters, what = self._adapted(self.shapes(), base=False)
    if adapters is None:
      raise UsageError(f"--job_log_dir={self.shown_job}: has no adapters yet (no checkpoint, "
                       "and train.init_from is no peft: source); train it first")
    return adapters, what

  def _adapted(self, shapes: MeshParams, base: bool = True) -> tuple[Any, Any, str]:
    """(the base's float parameters (None unless `base`), the adapters or None, what they
    are), the checkpoint's record of its base checked against the base loaded."""
    setup, choice = self.setup, self.choose()
    frozen = frozen_weights.FrozenWeights(setup, self.mesh)
    params, base_what = frozen.load_float()
    if frozen_weights.is_qlora(setup):  # The int8 base the adapters were trained over.
      with jax.set_mesh(self.mesh):
        params = frozen.dequantized(frozen.load_quantized(params))
    if not base:
      params = None
    adapter_shapes = MeshParams(setup.model.with_adapters(setup.train.lora),
                                setup.train_data.sequence_length, setup.partitioner,
                                self.mesh, collection=lora.COLLECTION)
    if choice.step is not None:
      frozen.check_resume(choice.checkpointer.metadata(choice.step), choice.step,
                          epath.Path(str(self.shown_job)) / "checkpoints")
      adapters = adapter_shapes.restore(choice.checkpointer, choice.step)
      return params, adapters, (f"step {choice.step} of {choice.shown_job} (LoRA adapters over "
                                f"{base_what})")
    if choice.source is None or not choice.source.brings_adapters:
      return params, None, f"{base_what} (train.init_from: {choice.shown_job} has no " \
          "checkpoint yet)"
    adapters, what = choice.source.load_adapters(adapter_shapes)
    return params, adapters, f"{what} (train.init_from: {choice.shown_job} has no checkpoint yet)"
