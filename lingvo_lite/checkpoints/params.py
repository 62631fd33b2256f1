"""Restoring only a checkpoint's parameters onto a mesh, for programs that never train.

A training checkpoint holds the whole TrainState; eval and decode need its parameters alone.
Their shapes and shardings come from the model's initializer traced under `jax.eval_shape`
with a stateless optimizer (`optax.identity`: no moments), through the very function that
shapes the train state (`train_state.sharded_abstract_state`), so the arrays land where
training places them, and no optimizer, schedule or train step is built. Nothing is allocated
but the parameters themselves (Checkpointer.restore_params skips the optimizer state on disk).

A checkpoint written with the other layer layout (one scanned `layers` subtree, or unrolled
`layer_N` subtrees; its metadata records which) is read in its own layout and converted on
host, once, then placed into this model's shardings.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import optax
from jax.sharding import Mesh

from lingvo_lite.training import train_state
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.partitioning import Partitioner


class MeshParams:
  """A model's parameters on a mesh, as shapes (nothing allocated), and the restore of a
  checkpoint's parameters into them.

  Attributes:
    abstract: The parameter tree as ShapeDtypeStructs carrying their shardings.
  """

  def __init__(self, model: nn.Module, sequence_length: int, partitioner: Partitioner,
               mesh: Mesh, abstract: Any = None, collection: str = "params"):
    """
    Args:
      model: The model whose parameters are restored (its `scan_layers` is the layout wanted).
      sequence_length: The length the model is initialized with (training's: the shapes
        must be the train state's).
      partitioner: Maps the parameters' logical axes onto the mesh.
      mesh: The devices they go to.
      abstract: The parameters' abstract tree, where the caller has it already (a program
        that also trains or evaluates shapes the whole state); None shapes it here.
      collection: The model's variables that are "the parameters" here: "params", or a LoRA
        model's adapters ("lora", models/lora.py), which a LoRA job's checkpoint holds.
    """
    self.model = model
    self._collection = collection
    self._sequence_length = sequence_length
    self._partitioner = partitioner
    self._mesh = mesh
    self.abstract = abstract if abstract is not None else self._abstract_of(model)

  def of(self, model: nn.Module, collection: str = "params") -> MeshParams:
    """Another model's variables (`collection`) on the same mesh and with the same length:
    a LoRA model's adapters beside its base's parameters."""
    return MeshParams(model, self._sequence_length, self._partitioner, self._mesh,
                      collection=collection)

  def _abstract_of(self, model: nn.Module) -> Any:
    return train_state.sharded_abstract_state(model, optax.identity(), self._sequence_length,
                                              self._partitioner, self._mesh,
                                              self._collection).abstract.params

  def restore(self, checkpointer: Checkpointer, step: int, fix: str | None = None) -> Any:
    """The parameters of `step`, in this model's layer layout and shardings (`fix`: the
    advice when they do not fit, Checkpointer.restore_params).

    Raises:
      UsageError: the step fails its checksums, cannot be read, or its parameters do not fit
        this model (Checkpointer.restore_params's one line).
    """
    saved_model = self.model.in_saved_layout(checkpointer.metadata(step))
    if saved_model is None:
      return checkpointer.restore_params(step, self.abstract, fix)
    saved = checkpointer.restore_params(step, self._abstract_of(saved_model), fix)
    shardings = jax.tree.map(lambda leaf: leaf.sharding, self.abstract)
    return jax.device_put(self.model.to_own_layout(jax.device_get(saved)), shardings)
