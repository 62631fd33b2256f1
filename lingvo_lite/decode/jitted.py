"""The jitted decode functions of one Setup on a mesh, with their shardings.

What the generator (lingvo_lite/decode/generator.py) runs and what `--mode=compile
--compile_program=decode` (programs/compile/decode_compile.py) compiles: the same functions with the
same shardings, as lingvo_lite/jitted.py is for training (DESIGN rule 5).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from lingvo_lite import target as targets
from lingvo_lite.decode import steps as decoding
from lingvo_lite.errors import config_error
from lingvo_lite.experiment import Setup
from lingvo_lite.training.train_state import strip_boxes


def check_decode_partitioning(setup: Setup, mesh: Mesh) -> None:
  """The slots split evenly over the data-parallel mesh axes (the cache's heads over
  `tensor` are checked with the key/value parameters, which have the same axis)."""
  sizes = dict(mesh.shape)
  ways = setup.partitioner.data_parallel_size(sizes)
  if setup.decode.slots % ways:
    batch_axes = " x ".join(setup.partitioner.mesh_axes_of(("batch",))[0]) or "none"
    raise config_error("decode.slots", setup.decode.slots,
                       f"must split evenly over the data-parallel size {ways} (mesh axes "
                       f"{batch_axes})", f"use a multiple of {ways}")


def end_token(setup: Setup, vocabulary: Any) -> int:
  """The id generation ends at: the vocabulary's EOS unless `decode.stop_at_eos` is off."""
  eos = getattr(vocabulary, "eos_id", None)
  return int(eos) if eos is not None and setup.decode.stop_at_eos else decoding.NO_EOS


# XLA options the decode functions are compiled with, by the target's platform. On a TPU,
# memory-space assignment moved each layer's freshly written cache into the chip's vector
# memory for the attention that reads it next, then copied it back to HBM for the next step:
# at 64 slots of SmolLM2-135M's shape, 60 copies of a 9.4 MB layer cache took 4.2 ms of a
# 4.5 ms step (bench/tpu_profile.py; the optimized HLO of `--mode=compile
# --compile_program=decode` shows the copy-start/copy-done pairs). A use worth less than the
# copy it needs is left where it is; the cache then stays in HBM and is updated in place.
COMPILER_OPTIONS: dict[str, dict[str, float]] = {
    "tpu": {"xla_tpu_msa_inefficient_use_to_copy_ratio": 1.0}}


class DecodeSteps:
  """The jitted decode functions of one Setup on a mesh, with their shardings: what the
  generator runs and what `--mode=compile --compile_program=decode` compiles (the same
  functions, the same shardings).

  Attributes:
    model: The model the functions run: the setup's, or its layers in another layout where
      that decodes faster on the target (`LanguageModel.for_decoding`).
    mesh: The device mesh.
    slots, cache_length, buckets: The shapes they are compiled for.
    eos_id: The end-of-sequence id generation stops at (decoding.NO_EOS for none).
    param_shardings, state_shardings: Where the parameters the functions take and the decode
      state live (the parameters in the family's decode form: `decode_params`).
    loaded_shardings: Where the parameters live as loaded (the training form, the setup's
      layout), before `decode_form` makes them into what the functions take (int8 weights,
      unrolled layers, say).
    prefill, generate: `decoding.prefill` and `decoding.generate`, jitted, the state donated,
      compiled with the target's `COMPILER_OPTIONS`.
  """

  def __init__(self, setup: Setup, mesh: Mesh | None = None, eos_id: int = decoding.NO_EOS):
    self.setup = setup
    # The model the functions run: the setup's, or its layers in the layout that decodes
    # fastest on the target (models/family.py: `for_decoding`).
    platform = targets.current_platform()
    self.model = model = setup.model.for_decoding(platform)
    settings = setup.decode
    self.mesh = mesh if mesh is not None else setup.partitioner.make_mesh()
    check_decode_partitioning(setup, self.mesh)
    self.slots = settings.slots
    self.cache_length = settings.resolved_cache_length(model.max_length)
    self.buckets = settings.resolved_buckets(model.max_length)
    self.eos_id = eos_id
    # Decoding runs no pipeline: a pipelined job's stacked layers replicated over its stage axis.
    partitioner = setup.partitioner.without_stages()
    self.state_shardings = partitioner.logical_to_sharding(decoding.logical_specs(model),
                                                         self.mesh)
    # The parameters' logical axes as loaded (the setup's layout) and in the decoding
    # model's layout, traced once: the shardings and abstract_params use them.
    loaded_specs = setup.model.parameter_logical_specs()
    self._specs = specs = (loaded_specs if model is setup.model
                           else model.parameter_logical_specs())
    self.loaded_shardings = partitioner.logical_to_sharding(loaded_specs, self.mesh)
    decode_specs = model.decode_param_specs(specs)
    self.param_shardings = partitioner.logical_to_sharding(decode_specs, self.mesh)
    # None where the family decodes with the parameters as loaded. Not donated: the loaded
    # arrays may be the caller's (device_put keeps arrays already in place), and int8 outputs
    # could not reuse float buffers anyway.
    relayout = model is not setup.model
    self._to_decode_form = None if decode_specs is specs and not relayout else jax.jit(
        lambda params: model.decode_params(
            model.to_own_layout(params) if relayout else params, specs),
        in_shardings=(self.loaded_shardings,), out_shardings=self.param_shardings)
    state = self.state_shardings
    options = COMPILER_OPTIONS.get(platform)
    self.prefill = jax.jit(
        functools.partial(decoding.prefill, model=model, eos_id=eos_id),
        in_shardings=(self.param_shardings, state, state.tokens, state.lengths, state.lengths,
                      state.lengths, state.sampling, state.seeds),
        out_shardings=state, donate_argnums=(1,), compiler_options=options)
    self.generate = jax.jit(
        functools.partial(decoding.generate, model=model, eos_id=eos_id),
        in_shardings=(self.param_shardings, state, None, state.lengths),
        out_shardings=state, donate_argnums=(1,), compiler_options=options)

  @contextlib.contextmanager
  def activated(self) -> Iterator[None]:
    """The mesh and the logical-axis rules, so the model's activation constraints apply."""
    rules = self.setup.partitioner.without_stages().rules
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(list(rules)):
      yield

  def empty_state(self) -> decoding.DecodeState:
    with self.activated():
      return jax.jit(functools.partial(decoding.empty_state, self.model, self.slots,
                                       self.cache_length),
                     out_shardings=self.state_shardings)()

  def abstract_state(self) -> decoding.DecodeState:
    """The decode state as shapes with their shardings (nothing allocated)."""
    shapes = jax.eval_shape(functools.partial(
        decoding.empty_state, self.model, self.slots, self.cache_length))
    return jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(
        leaf.shape, leaf.dtype, sharding=sharding), shapes, self.state_shardings)

  def decode_form(self, params: Any) -> Any:
    """Loaded parameters (host or device arrays, boxed or not) placed on the mesh in the form
    the functions take: the family's `decode_params` (int8 weights quantized once, here)."""
    params = jax.device_put(strip_boxes(params), self.loaded_shardings)
    if self._to_decode_form is None:
      return params
    with self.activated():
      return self._to_decode_form(params)

  def abstract_params(self) -> Any:
    """The parameters the functions take, as shapes with their shardings."""
    # The key is made inside eval_shape: made eagerly under a topology's mesh (a TPU compile
    # on a CPU host) it would be placed on devices that hold no arrays.
    model = self.model
    shapes = jax.eval_shape(lambda: model.decode_params(strip_boxes(model.init(
        jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]), self._specs))
    return jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(
        leaf.shape, leaf.dtype, sharding=sharding), shapes, self.param_shardings)

  def lower_prefill(self, bucket: int) -> Any:
    """The prefill of prompts padded to `bucket`, lowered from shapes only."""
    state = self.abstract_state()
    per_slot = lambda dtype: jax.ShapeDtypeStruct((self.slots,), dtype,
                                                  sharding=self.state_shardings.lengths)
    with self.activated():
      return self.prefill.lower(
          self.abstract_params(), state,
          jax.ShapeDtypeStruct((self.slots, bucket), jnp.int32,
                               sharding=self.state_shardings.tokens),
          per_slot(jnp.int32), per_slot(jnp.bool_), per_slot(jnp.int32), state.sampling,
          state.seeds)

  def lower_generate(self) -> Any:
    """The generate loop, lowered from shapes only."""
    with self.activated():
      return self.generate.lower(
          self.abstract_params(), self.abstract_state(), jax.ShapeDtypeStruct((), jnp.int32),
          jax.ShapeDtypeStruct((self.slots,), jnp.bool_, sharding=self.state_shardings.done))
