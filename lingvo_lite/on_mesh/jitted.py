"""The jitted step functions of a Setup on a mesh, shared by every program.

Train, eval and AOT compile all get their steps from here, with the same shardings, so a
compiled program is exactly the one that trains (DESIGN rule 5).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from lingvo_lite import target as targets
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.data.source import Batch, local_rows
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup, pipeline_settings
from lingvo_lite.models.lora import COLLECTION as LORA_COLLECTION
from lingvo_lite.on_mesh import rollouts as rollouts_lib
from lingvo_lite.training import objectives, steps, train_state
from lingvo_lite.training.objectives.objective import Objective
from lingvo_lite.weights import frozen_weights


def data_blocks(batch_sharding: jax.sharding.Sharding, global_batch_size: int
                ) -> dict[int, tuple[int, int]]:
  """Which block of the batch each process reads: {process: (block index, blocks)}, so its
  data source reads `local_rows(global_batch_size, index, blocks)`.

  Processes whose devices hold the same rows read the same block: one per process normally,
  fewer where a mesh axis the batch is not split over spans processes (a pipeline's stages
  across processes hold every row of their replica). Checked for every process of the target
  (a compile for a 64-host pod checks all 64), from the sharding alone: sources hand out
  contiguous blocks, and a mesh whose batch axes put other rows on a process's devices would
  silently train on the wrong examples.
  """
  rows_of: dict[int, set[int]] = {}
  for device, index in batch_sharding.devices_indices_map((global_batch_size, 1)).items():
    rows_of.setdefault(device.process_index, set()).update(
        range(*index[0].indices(global_batch_size)))
  starts = sorted({min(rows) for rows in rows_of.values()})
  blocks = {}
  for process in sorted(rows_of):
    rows = sorted(rows_of[process])
    block = starts.index(rows[0])
    expected = (list(local_rows(global_batch_size, block, len(starts)))
                if global_batch_size % len(starts) == 0 else [])
    if rows != expected:
      raise UsageError(
          f"partitioner: the mesh puts batch rows {rows[0]}..{rows[-1]} on process "
          f"{process}, which is not one of {len(starts)} equal contiguous blocks of the "
          f"{global_batch_size} rows; order the mesh so each process's devices hold one "
          "contiguous block of the batch axes")
    blocks[process] = (block, len(starts))
  return blocks


class JittedSteps:
  """Mesh, abstract state, shardings and the jitted train/eval steps of one Setup.

  Attributes:
    model: The model the steps apply: the Setup's, with LoRA adapters where `train.lora` asks
      (models/lora.py).
    objective: What the train step minimizes (`train.objective`: training/objectives/).
    frozen: The frozen parameters' shapes, loading and placing (weights/frozen_weights.py),
      where a step reads any (`train.lora`, an objective's reference); else None.
  """

  def __init__(self, setup: Setup, mesh: Mesh | None = None,
               target: targets.Target | None = None):
    self.setup = setup
    self.target = target or targets.current()
    self.mesh = mesh if mesh is not None else setup.partitioner.make_mesh(self.target.devices)
    total_steps = setup.train.steps
    self.optimizer = setup.optimizer.make(total_steps)
    self.schedule = setup.optimizer.schedule(total_steps)
    lora = setup.train.lora
    self.model = setup.model.with_adapters(lora) if lora is not None else setup.model
    self._pipelined()
    self.adapters = lora is not None
    trained = train_state.sharded_abstract_state(
        self.model, self.optimizer, setup.train_data.sequence_length, setup.partitioner,
        self.mesh, collection=LORA_COLLECTION if self.adapters else "params",
        other="params" if self.adapters else None)
    base = None
    if self.adapters:  # The base's shapes came from the same trace as the adapters'.
      trained, base = trained
    elif setup.train.has_frozen:  # A full fine-tune's reference: the parameters' shapes.
      base = trained.abstract.params
    self.offload_state = setup.optimizer.offload_state
    if self.offload_state:
      trained = train_state.offloaded(trained)
    self.frozen = (frozen_weights.FrozenWeights(setup, self.mesh, base)
                   if setup.train.has_frozen else None)
    if self.frozen is not None:  # The step's state holds them too; a checkpoint does not.
      trained = train_state.ShardedState(
          abstract=trained.abstract.replace(frozen=self.frozen.abstract),
          shardings=trained.shardings.replace(frozen=self.frozen.shardings))
    self.sharded_state = trained
    self.batch_sharding = setup.partitioner.batch_sharding(self.mesh)
    # This process's block of every batch (its data source's rows).
    self.data_blocks = data_blocks(self.batch_sharding, setup.train_data.global_batch_size)
    self.data_block = self.data_blocks[jax.process_index()]
    state_shardings = self.sharded_state.shardings
    self.objective = setup.train.objective
    dropout = lora is not None and lora.dropout > 0
    self.train_step = jax.jit(
        functools.partial(
            steps.train_step, model=self.model, optimizer=self.optimizer,
            schedule=self.schedule, objective=self.objective, z_loss=setup.train.z_loss,
            grad_accum_steps=setup.train.grad_accum_steps,
            log_grad_norm=setup.train.log_grad_norm,
            ravel_norm=self.mesh.size == 1 and self.target.platform == "cpu",
            adapters=self.adapters, dropout_seed=setup.train.seed if dropout else None,
            offload_state=self.offload_state),
        in_shardings=(state_shardings, self.batch_sharding),
        out_shardings=(state_shardings, None),
        donate_argnums=(0,))
    self._eval_steps: list[tuple[Objective, bool, Any]] = []
    # Checked before every save, so only finite states are ever written.
    checked = state_shardings.replace(frozen=None)
    self._is_finite = jax.jit(steps.is_finite, in_shardings=(
        checked.replace(opt_state=None) if self.offload_state else checked,))
    self._offloaded_is_finite = jax.jit(
        lambda leaf: steps.is_finite(jax.device_put(leaf, jax.memory.Space.Device)))

  def _pipelined(self) -> None:
    """The steps' model runs the setup's pipeline, if any (`pipeline`: the parameters are the
    same, only the steps change)."""
    self.pipeline = pipeline_settings(self.setup, self.mesh.size)
    if self.pipeline is not None:
      self.model = self.model.with_pipeline(self.pipeline)

  def state_is_finite(self, state: train_state.TrainState) -> jax.Array:
    """Whether every float of `state` (but its frozen parameters) is finite, as one scalar on
    the device. An offloaded optimizer state is brought to the device an array per call
    (XLA computes only on the device's memory), never whole: beside the parameters it may not
    fit."""
    state = state.replace(frozen=None)
    if not self.offload_state:
      return self._is_finite(state)
    checks = [self._is_finite(state.replace(opt_state=None))]
    checks += [self._offloaded_is_finite(leaf) for leaf in jax.tree.leaves(state.opt_state)]
    return jnp.all(jnp.stack(checks))

  @contextlib.contextmanager
  def activated(self) -> Iterator[None]:
    """Target, mesh and logical-axis rules in scope, so the model traces for the target's
    platform and its activation constraints apply."""
    with targets.active(self.target), jax.set_mesh(self.mesh), \
        nn.logical_axis_rules(list(self.setup.partitioner.rules)):
      yield

  def scorer(self, source: Any) -> Objective:
    """The objective that scores eval set `source` (training/objectives/: the job's own, or
    the one that reads such rows)."""
    return objectives.scorer(self.objective, source)

  def eval_step(self, objective: Objective, per_token: bool = False) -> Any:
    """The jitted eval step of `objective`'s sums, `(params, batch, frozen) -> sums`; with
    `per_token`, also each token's loss (for eval sets scored per document). Jitted once
    per objective and kind, in the eval shardings."""
    for known, known_per_token, step in self._eval_steps:  # Equal settings: one jit.
      if known == objective and known_per_token == per_token:
        return step
    shardings = self.sharded_state.shardings
    step = jax.jit(functools.partial(steps.eval_step, model=self.model, objective=objective,
                                     per_token=per_token, adapters=self.adapters),
                   in_shardings=(shardings.params, self.batch_sharding, shardings.frozen))
    self._eval_steps.append((objective, per_token, step))
    return step

  def train_batch_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
    """The global batch a train step takes, as {key: (shape, dtype)}: the train data's, as
    the objective makes its batch from it."""
    return dict(self.objective.training_batch_spec(self.setup.train_data))

  def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
    """The train step's global batch as shapes with the batch sharding (no data read)."""
    return {key: jax.ShapeDtypeStruct(shape, np.dtype(dtype), sharding=self.batch_sharding)
            for key, (shape, dtype) in self.train_batch_spec().items()}

  @functools.cached_property
  def rollouts(self) -> rollouts_lib.Rollouts:
    """The policy's own completions of prompt records, sampled through the decode engine on
    this mesh and scored (on_mesh/rollouts.py): for an objective whose rows are sampled."""
    return rollouts_lib.Rollouts(self)

  def training_batch(self, local_batch: Batch, state: train_state.TrainState
                     ) -> dict[str, jax.Array]:
    """This process's rows of the data's batch, made into the train step's global batch by
    the objective (before the step from `state`)."""
    return self.global_batch(self.objective.training_batch(local_batch, state, self))

  def lower_train_step(self) -> Any:
    """The train step lowered from shapes only: what `--mode=compile` compiles and saves."""
    with self.activated():
      return self.train_step.lower(self.sharded_state.abstract, self.abstract_batch())

  @property
  def checkpointed_state(self) -> train_state.ShardedState:
    """The state as a checkpoint holds it: without the frozen parameters."""
    return train_state.ShardedState(abstract=self.sharded_state.abstract.checkpointed(),
                                    shardings=self.sharded_state.shardings.checkpointed())

  def init_state(self, frozen: Any = None) -> train_state.TrainState:
    """A fresh state (the trained variables from `train.seed`), holding `frozen` (where the
    setup has them: `self.frozen.load()`'s)."""
    state = train_state.create_state(
        self.model, self.optimizer, self.setup.train.seed,
        self.setup.train_data.sequence_length, self.checkpointed_state.shardings,
        collection=LORA_COLLECTION if self.adapters else "params")
    return state.replace(frozen=frozen)

  def state_with_params(self, params: Any, frozen: Any = None) -> train_state.TrainState:
    """A step-0 state with `params` (placed in this setup's shardings) and a fresh optimizer,
    holding `frozen`."""
    state = train_state.state_with_params(self.optimizer, params,
                                          self.checkpointed_state.shardings)
    return state.replace(frozen=frozen)

  @property
  def checkpoint_metadata(self) -> dict[str, Any]:
    """What a checkpoint records about the state's layout (the model's family says), and the
    frozen parameters' fingerprint where a step reads any (a resume refuses other ones)."""
    metadata = self.setup.model.layout_metadata()
    if self.frozen is not None and self.frozen.fingerprint is not None:
      metadata[frozen_weights.METADATA_KEY] = self.frozen.fingerprint
    return metadata

  def _saved_layout(self, checkpointer: Checkpointer,
                    step: int) -> train_state.ShardedState | None:
    """The abstract state in the layer layout `step` was written with, where that is not this
    setup's (None where it is, or the checkpoint does not say)."""
    saved_model = self.model.in_saved_layout(checkpointer.metadata(step))
    if saved_model is None:
      return None
    saved = train_state.sharded_abstract_state(
        saved_model, self.optimizer, self.setup.train_data.sequence_length,
        self.setup.partitioner, self.mesh,
        collection=LORA_COLLECTION if self.adapters else "params")
    return train_state.offloaded(saved) if self.offload_state else saved

  def _to_this_layout(self, tree: Any) -> Any:
    """A restored state or params tree in the other layer layout -> host arrays in this
    setup's layout (the conversion stacks or slices on host, once, at restore)."""
    return self.setup.model.to_own_layout(jax.device_get(tree))

  def restore_state(self, checkpointer: Checkpointer, step: int) -> train_state.TrainState:
    """Restores `step` into this setup's shardings, converting the layer layout (scanned or
    unrolled) when the checkpoint was written with the other one."""
    saved_layout = self._saved_layout(checkpointer, step)
    if saved_layout is None:
      return checkpointer.restore(step, self.checkpointed_state.abstract)
    state = self._to_this_layout(checkpointer.restore(step, saved_layout.abstract))
    return jax.device_put(state, self.checkpointed_state.shardings)

  def restore_params(self, checkpointer: Checkpointer, step: int, fix: str | None = None
                     ) -> Any:
    """Restores only the parameters of `step`, into this setup's parameter shardings
    (checkpoints/params.py, which converts the layer layout as `restore_state` does): for
    eval, which has the whole state's shapes already. The optimizer state is neither read nor
    allocated. `fix`: the advice when they do not fit (Checkpointer.restore_params)."""
    return self.mesh_params().restore(checkpointer, step, fix)

  def mesh_params(self) -> MeshParams:
    """The model's parameters on this mesh as shapes (the train state's), for a restore of
    parameters alone."""
    return MeshParams(self.model, self.setup.train_data.sequence_length,
                      self.setup.partitioner, self.mesh,
                      abstract=self.sharded_state.abstract.params,
                      collection=LORA_COLLECTION if self.adapters else "params")

  def global_batch(self, local_batch: Batch) -> dict[str, jax.Array]:
    """Assembles this process's rows into global arrays sharded over the batch axes."""
    blocks = self.data_block[1]
    return {
        key: jax.make_array_from_process_local_data(
            self.batch_sharding, np.asarray(value),
            (np.shape(value)[0] * blocks, *np.shape(value)[1:]))
        for key, value in local_batch.items()
    }
