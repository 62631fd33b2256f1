"""The parameters a train step reads and never changes: a LoRA job's base model, or the
reference of a full fine-tune whose objective needs one (a frozen copy of its starting
parameters: DPO's, training/objectives/).

They are the weights `train.init_from` names (a fresh initialization from `train.seed`
without one), loaded on every start, a resume's included: a checkpoint holds only what is
trained (a LoRA job's adapters, models/lora.py), and records the frozen weights' fingerprint
(the source's `sha256:`, or the seed), so a resume over other weights is refused in one line
rather than training adapters on a base they were not made for. Under
`model.quantization="int8_weights"` a LoRA job's base is held as int8 values with a scale per
output channel (QLoRA, on the project's own int8 weights: models/quantization.py), quantized
once when loaded; the adapters stay float32.

`FrozenWeights` is their shapes and shardings (what a step's state and its compile hold, and
the memory verdict counts), their load, and the check a resume makes.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.errors import UsageError
from lingvo_lite.weights.job_checkpoint import FIELD

# Where a checkpoint's metadata records the frozen weights' fingerprint.
METADATA_KEY = "frozen_weights"


def fingerprint_of(what: str) -> str:
  """The `sha256:<hex>` a source's description carries (weights/: every format's `load`
  names what it read so), else the description itself."""
  found = re.search(r"sha256:[0-9a-f]+", what)
  return found.group(0) if found else what


def is_qlora(setup: Any) -> bool:
  """Whether a LoRA job's base is held in int8 (`model.quantization="int8_weights"`)."""
  return setup.train.lora is not None and setup.model.quantization == "int8_weights"


class FrozenWeights:
  """A Setup's frozen parameters on a mesh: shapes, shardings, load.

  Attributes:
    source_shapes: The model's float parameters on the mesh, as a source loads them.
    abstract: The frozen tree as shapes with shardings (int8 weights and scales for QLoRA).
    shardings: Its shardings.
    fingerprint: What `load` read (`sha256:...`, or `seed:N`); None before.
  """

  def __init__(self, setup: Any, mesh: Any, abstract_params: Any = None):
    """`abstract_params`: the model's parameters' shapes on `mesh`, where the caller has them
    (a LoRA job's trace of its adapted model holds them); None traces them here."""
    self.setup = setup
    model = setup.model
    self.source_shapes = MeshParams(model, setup.train_data.sequence_length, setup.partitioner,
                                    mesh, abstract=abstract_params)
    self._quantize = None
    if is_qlora(setup):
      specs = model.parameter_logical_specs()
      self.shardings = setup.partitioner.logical_to_sharding(model.decode_param_specs(specs),
                                                             mesh)
      quantize = lambda params: model.decode_params(params, specs)
      shapes = jax.eval_shape(quantize, self.source_shapes.abstract)
      self.abstract = jax.tree.map(
          lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
          shapes, self.shardings)
      self._quantize = jax.jit(quantize, out_shardings=self.shardings, donate_argnums=0)
    else:
      self.abstract = self.source_shapes.abstract
      self.shardings = jax.tree.map(lambda leaf: leaf.sharding, self.abstract)
    self.fingerprint: str | None = None

  def load_float(self) -> tuple[Any, str]:
    """(the frozen weights as float parameters in their shardings, what was loaded): the
    source's (a `peft:` source's base), or a fresh initialization from `train.seed`."""
    setup = self.setup
    source = setup.train.init_from
    if source is None:
      seed = setup.train.seed
      tokens = jnp.zeros((1, setup.train_data.sequence_length), jnp.int32)
      shardings = jax.tree.map(lambda leaf: leaf.sharding, self.source_shapes.abstract)
      params = jax.jit(lambda key: nn.meta.unbox(setup.model.init(key, tokens)["params"]),
                       out_shardings=shardings)(jax.random.key(seed))
      what = f"a fresh initialization (train.seed={seed})"
      self.fingerprint = f"seed:{seed}"
      return params, what
    params, what = source.load_base(self.source_shapes)
    self.fingerprint = fingerprint_of(what)
    return params, what

  def load(self) -> tuple[Any, str]:
    """(the frozen weights as a step reads them: int8 for QLoRA, what was loaded)."""
    params, what = self.load_float()
    return self.load_quantized(params), what

  def load_quantized(self, params: Any) -> Any:
    """Float parameters (`load_float`'s, donated) as a step reads them: int8 for QLoRA."""
    return params if self._quantize is None else self._quantize(params)

  def check_resume(self, metadata: Mapping[str, Any], step: int, shown_checkpoints: Any) -> None:
    """Refuses a resume over frozen weights other than those the checkpoint was trained with
    (its metadata's record; a checkpoint without one is not checked). Call after `load`."""
    recorded = metadata.get(METADATA_KEY) if isinstance(metadata, Mapping) else None
    if recorded is None or recorded == self.fingerprint:
      return
    source = self.setup.train.init_from
    named = source.describe() if source is not None else f"train.seed={self.setup.train.seed}"
    raise UsageError(
        f"{FIELD}={named}: gives frozen weights {self.fingerprint}, but step {step} in "
        f"{shown_checkpoints} was trained over {recorded}; give the base it was trained on, or "
        "a new --job_log_dir")

  def dequantized(self, frozen: Any) -> Any:
    """The frozen weights as the float parameters a step computes with (QLoRA's int8 weights
    times their scales, which is what its adapters were trained over)."""
    if self._quantize is None:
      return frozen
    from lingvo_lite.models import quantization  # pylint: disable=g-import-not-at-top
    return jax.tree.map(lambda leaf: quantization.dequantize(leaf) if quantization.is_quantized(
        leaf) else leaf, frozen, is_leaf=quantization.is_quantized)
