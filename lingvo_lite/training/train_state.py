"""The training state pytree and how it is shaped, sharded and initialized.

Shapes come first (docs/DESIGN.md, "Shapes first"): `abstract_state` runs the initializer under
`jax.eval_shape`, keeping Flax's logical-axis boxes, so one abstract tree yields the
shardings, the checkpoint restore target and the AOT compile inputs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from lingvo_lite.partitioning import Partitioner


class TrainState(flax.struct.PyTreeNode):
  """The state a train step updates.

  Attributes:
    step: The optimizer steps taken.
    params: The trained parameters: the model's, or a LoRA job's adapters (models/lora.py).
    opt_state: The optimizer's state over `params`.
    frozen: Parameters the step reads and never changes, or None: a LoRA job's base model
      (also DPO's reference: the model with adapters off), or a full fine-tune's DPO reference
      (a frozen copy of its starting parameters). Not checkpointed: every start loads it from
      its source (`train.init_from`), whose fingerprint the checkpoint records.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  frozen: Any = None

  def checkpointed(self) -> TrainState:
    """What a checkpoint holds: the state without `frozen`."""
    return self.replace(frozen=None)


@dataclasses.dataclass(frozen=True)
class ShardedState:
  """An abstract TrainState (ShapeDtypeStructs carrying their shardings)."""

  abstract: TrainState
  shardings: TrainState


def strip_boxes(tree: Any) -> Any:
  """The values inside Flax's logical-axis boxes, without the sharding constraint that
  `nn.meta.unbox` applies when a mesh is active (which fails on abstract values)."""
  return jax.tree.map(lambda x: x.value if isinstance(x, nn.meta.AxisMetadata) else x, tree,
                      is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))


def init_state(model: nn.Module, optimizer: optax.GradientTransformation, rng: jax.Array,
               sequence_length: int, collection: str = "params") -> TrainState:
  """Initializes the trained variables (the model's `collection`: "params", or a LoRA
  model's "lora" adapters) and their optimizer state; they keep their logical-axis boxes.
  Under jit, the other collections' initialization is dead code XLA drops."""
  tokens = jnp.zeros((1, sequence_length), jnp.int32)
  params = model.init(rng, tokens)[collection]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params))


def sharded_abstract_state(model: nn.Module, optimizer: optax.GradientTransformation,
                           sequence_length: int, partitioner: Partitioner,
                           mesh: Mesh, collection: str = "params",
                           other: str | None = None) -> Any:
  """Shapes and shardings of the state (of `collection`'s variables), without allocating
  it; with `other`, also that collection's variables as shapes with shardings, from the same
  trace (a LoRA model's base parameters beside its adapters): `(state, other's)`."""
  def init(rng):
    if other is None:
      return init_state(model, optimizer, rng, sequence_length, collection)
    variables = model.init(rng, jnp.zeros((1, sequence_length), jnp.int32))
    params = variables[collection]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params)), variables[other]

  boxed = jax.eval_shape(init, jax.random.key(0))
  shardings = partitioner.logical_to_sharding(nn.get_partition_spec(boxed), mesh)
  abstract = jax.tree.map(
      lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
      strip_boxes(boxed), shardings)
  if other is None:
    return ShardedState(abstract=abstract, shardings=shardings)
  return ShardedState(abstract=abstract[0], shardings=shardings[0]), abstract[1]


# Where an offloaded optimizer state lives between steps (`AdamW.offload_state`): host memory
# the device can copy to and from directly.
HOST_MEMORY = "pinned_host"


def offloaded(sharded: ShardedState) -> ShardedState:
  """`sharded` with its optimizer state in the host's pinned memory: its shardings (and the
  abstract arrays' ones, which a restore and an AOT compile read) of that memory kind, the
  same devices and partition. The train step brings it to the device for the update
  (`steps.train_step`'s `offload_state`)."""
  def on_host(leaf: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                sharding=leaf.sharding.with_memory_kind(HOST_MEMORY))
  opt_state = jax.tree.map(on_host, sharded.abstract.opt_state)
  return ShardedState(
      abstract=sharded.abstract.replace(opt_state=opt_state),
      shardings=sharded.shardings.replace(
          opt_state=jax.tree.map(lambda leaf: leaf.sharding, opt_state)))


def create_state(model: nn.Module, optimizer: optax.GradientTransformation, seed: int,
                 sequence_length: int, shardings: TrainState,
                 collection: str = "params") -> TrainState:
  """Initializes the state directly into its shardings (no full copy on one device)."""
  def init(rng):
    return nn.meta.unbox(init_state(model, optimizer, rng, sequence_length, collection))
  return jax.jit(init, out_shardings=shardings)(jax.random.key(seed))


def state_with_params(optimizer: optax.GradientTransformation, params: Any,
                      shardings: TrainState) -> TrainState:
  """A step-0 state around `params` (a warm start's, already in their shardings): the
  optimizer's initial state made from them, without initializing parameters only to replace
  them (a trace and compile of the model's initializer, and a second copy of the
  parameters). `params` are donated."""
  def make(params):
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params))
  return jax.jit(make, out_shardings=shardings, donate_argnums=0)(params)
