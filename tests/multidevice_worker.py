"""Runs in a child process with 8 forced CPU devices (XLA_FLAGS set by the parent test) and
prints one JSON object: per-mesh losses and parameter PartitionSpecs, and the outcome of
bad partitioning commands. The parent (tests/test_partitioning.py) asserts on it. With the
argument `deepseek`, 16 devices: a tiny DeepSeek-style MoE on data x fsdp x tensor x expert.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.multidevice_worker
  XLA_FLAGS=--xla_force_host_platform_device_count=16 python -m tests.multidevice_worker deepseek
"""

import functools
import json
import re
import sys
import tempfile

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from lingvo_lite.decode import jitted as decode_steps, steps as decoding
from lingvo_lite.models import decode_attention, transformer
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.testing import run_cli, synthetic_tiny_setup

SETS = ("model.vocab_size=256", "train_data.vocab_size=256", "eval_data.vocab_size=256",
        "train_data.global_batch_size=8", "eval_data.global_batch_size=8",
        "optimizer.warmup_steps=1")
MESHES = {"single": None, "data8": (8, 1, 1), "fsdp8": (1, 8, 1), "data2_fsdp2_tensor2": (2, 2, 2)}
BAD_PARTITIONING = {
    "mesh_vs_devices": ["--fdl.partitioner.ici_data=3"],
    "batch_vs_data_parallel": ["--fdl.train_data.global_batch_size=4"],
    "dimension_vs_axis": ["--fdl.partitioner.ici_data=1", "--fdl.partitioner.ici_tensor=8"],
    "unknown_logical_axis": ["--fdl.partitioner.rules=(('batch', 'data'), ('embd', 'fsdp'))"],
    "unknown_mesh_axis": ["--fdl.partitioner.rules=(('batch', 'dp'),)"],
}


# The TPU flash-attention kernel (interpreted here) on a data x fsdp x tensor mesh, placed
# per shard, against the written-out attention on one device: sequences of 128, which its
# blocks divide.
SPLASH_SETS = ("train_data.sequence_length=128", "eval_data.sequence_length=128",
               "model.max_length=128")
SPLASH_MESHES = {"einsum_single": (None, "einsum"), "splash_data2_fsdp2_tensor2":
                 ((2, 2, 2), "splash")}


# Today's dense families, tiny (sliding windows of 16 in rows of 64, a mixed pattern of three
# layers, query and key norms per head or over the projection, which the tensor axis splits):
# their train steps on data x fsdp x tensor, against one device.
DENSE_FAMILIES = ("PyCodeQwen3Tiny", "PyCodeGemma3Tiny", "PyCodeOlmo3Tiny")


def _losses_and_specs(mesh_shape, extra_sets=(), steps=5, experiment="PyCodeLlamaTiny",
                      find_kernel=False):
  """`find_kernel`: whether to trace the train step once more to see if it calls a Pallas
  kernel (`kernel`: the splash cases ask; a trace of the whole step, ~1-2 s on 2 cores, that
  the other cases do not need; None where not asked)."""
  sets = SETS + tuple(extra_sets)
  if mesh_shape is not None:
    sets += tuple(f"partitioner.ici_{axis}={size}"
                  for axis, size in zip(("data", "fsdp", "tensor"), mesh_shape))
  setup = synthetic_tiny_setup(experiment, *sets)
  devices = jax.devices()[:1] if mesh_shape is None else jax.devices()
  jitted = JittedSteps(setup, setup.partitioner.make_mesh(devices))
  losses = []
  with jitted.activated():
    state = jitted.init_state()
    kernel = None
    if find_kernel:
      kernel = "pallas_call" in str(jax.make_jaxpr(jitted.train_step)(
          state, jitted.global_batch(setup.train_data.batch(0))))
    for step in range(steps):
      state, metrics = jitted.train_step(state, jitted.global_batch(setup.train_data.batch(step)))
      losses.append(float(metrics["loss"]))
  shardings = jitted.sharded_state.shardings
  specs = {jax.tree_util.keystr(path): str(sharding.spec) for path, sharding in
           jax.tree_util.tree_flatten_with_path(shardings.params)[0]}
  # Adam's moments must be sharded like the parameters they follow.
  mu = optax.tree_utils.tree_get(state.opt_state, "mu")
  moments_match = all(m.sharding.spec == p.sharding.spec for m, p in
                      zip(jax.tree.leaves(mu), jax.tree.leaves(state.params)))
  return {"losses": losses, "specs": specs, "moments_match": moments_match,
          "finite": bool(np.isfinite(losses).all()), "kernel": kernel}


# Decode: 8 slots of mixed prompt lengths, 10 steps after the prefill, greedy and sampled.
DECODE_SETS = SETS + ("decode.cache_length=32", "decode.slots=8")
DECODE_MESHES = {"single": None, "data4_tensor2": (4, 1, 2)}
# The same with int8 weights (quantized once, as loaded): their values and scales split as
# the float weights are, on data=2 x fsdp=2 x tensor=2.
INT8_WEIGHTS_MESHES = {"single": None, "data2_fsdp2_tensor2": (2, 2, 2)}
INT8_WEIGHTS = ('model.quantization="int8_weights"',)


def _decode_logits(mesh_shape, extra_sets=(), experiment="PyCodeLlamaTiny"):
  """Each step's logits [slots, vocab] and tokens of a decode on one device or a mesh, the
  cache and slots sharded (slots over data, key/value heads over tensor; a mesh of 4 sizes
  names data, fsdp, tensor, expert)."""
  sets = DECODE_SETS + tuple(extra_sets)
  if mesh_shape is not None:
    sets += tuple(f"partitioner.ici_{axis}={size}"
                  for axis, size in zip(("data", "fsdp", "tensor", "expert"), mesh_shape))
  setup = synthetic_tiny_setup(experiment, *sets)
  devices = jax.devices()[:1] if mesh_shape is None else jax.devices()
  steps = decode_steps.DecodeSteps(setup, setup.partitioner.make_mesh(devices))
  params = jax.jit(setup.model.init)(jax.random.key(2), jnp.zeros((1, 8), jnp.int32))
  params = steps.decode_form(params["params"])
  lengths = np.array([1, 3, 5, 7, 9, 11, 13, 15], np.int32)
  prompts = np.zeros((8, 16), np.int32)
  for slot, length in enumerate(lengths):
    prompts[slot, :length] = np.random.default_rng(slot).integers(3, 250, size=length)
  sampled = decoding.sampling.sampling_params(8, temperature=[0.0, 1.0] * 4, top_k=5)
  seeds = np.stack([decoding.key_data(seed) for seed in range(8)])
  step = jax.jit(functools.partial(decoding.step, model=setup.model),
                 in_shardings=(steps.param_shardings, steps.state_shardings),
                 out_shardings=(steps.state_shardings, None))
  with steps.activated():
    state = steps.prefill(params, steps.empty_state(), prompts, lengths, np.ones(8, bool),
                          lengths + 16, sampled, seeds)
    logits = []
    for _ in range(10):
      state, step_logits = step(params, state)
      logits.append(np.asarray(step_logits).tolist())
  cache_spec = str(state.cache.keys[0].sharding.spec)  # Layer 0's (unrolled layers).
  query = params["layer_0"]["attention"]["query_kernel"]
  query_specs = ([str(query.qvalue.sharding.spec), str(query.scale.sharding.spec)]
                 if hasattr(query, "qvalue") else [str(query.sharding.spec)])
  return {"logits": logits, "tokens": np.asarray(state.tokens).tolist(),
          "cache_spec": cache_spec, "query_specs": query_specs}


def _decode_by_position(mesh_shape):
  """`_decode_logits` with the cache forced "by position" (models/kv_cache.py: what a TPU
  keeps where the paged kernel does not decode; a CPU keeps it by head)."""
  chosen = transformer.TransformerLM.cache_layout
  transformer.TransformerLM.cache_layout = lambda self: "positions"
  try:
    return _decode_logits(mesh_shape)
  finally:
    transformer.TransformerLM.cache_layout = chosen


def _decode_kernel_on_a_mesh():
  """The TPU decode kernel (interpreted here) placed per shard, slots over data=4 and
  key/value heads over tensor=2, against the kernel on one device: each (slot, head) is the
  same computation, so the outputs are equal. Inputs bfloat16 holds exactly."""
  shape = (8, 2, 64, 128)
  keys, values = (jax.random.normal(jax.random.key(seed), shape).astype(jnp.bfloat16)
                  for seed in (0, 1))
  q = jax.random.normal(jax.random.key(2), (8, 2, 3, 128)).astype(jnp.bfloat16).astype(
      jnp.float32)
  lengths = jnp.arange(1, 65, 8, dtype=jnp.int32)
  single = decode_attention.attend(q, keys, values, lengths)
  partitioner = Partitioner(ici_data=4, ici_tensor=2)
  mesh = partitioner.make_mesh(jax.devices())
  attend = jax.jit(decode_attention.attend)
  with jax.set_mesh(mesh), nn.logical_axis_rules(list(partitioner.rules)):
    heads = NamedSharding(mesh, PartitionSpec("data", "tensor"))
    args = (jax.device_put(q, heads), jax.device_put(keys, heads),
            jax.device_put(values, heads),
            jax.device_put(lengths, NamedSharding(mesh, PartitionSpec("data"))))
    sharded = attend(*args)
    placed = "shard_map" in str(jax.make_jaxpr(attend)(*args))
  return {"max_difference": float(jnp.max(jnp.abs(sharded - single))), "per_shard": placed,
          "output_spec": str(sharded.sharding.spec)}


# QLoRA (rank 4 on every attention projection and MLP matrix, over an int8 base: LoRA's
# adapters and the int8 weights' values and scales all placed) on one device and on
# data=2 x fsdp=2 x tensor=2.
LORA_MESHES = {"single": None, "data2_fsdp2_tensor2": (2, 2, 2)}


def _lora_losses(mesh_shape, quantization="int8_weights", steps=3):
  from lingvo_lite.config import building, fiddlers  # pylint: disable=g-import-not-at-top
  from lingvo_lite.testing import tiny_config  # pylint: disable=g-import-not-at-top
  sets = SETS + ("optimizer.peak_learning_rate=0.05",)
  if mesh_shape is not None:
    sets += tuple(f"partitioner.ici_{axis}={size}"
                  for axis, size in zip(("data", "fsdp", "tensor"), mesh_shape))
  cfg = tiny_config("PyCodeLlamaTiny", *sets, synthetic=True)
  fiddlers.lora(cfg)
  cfg.train.lora.rank = 4
  cfg.model.quantization = quantization
  setup = building.build(cfg)
  devices = jax.devices()[:1] if mesh_shape is None else jax.devices()
  jitted = JittedSteps(setup, setup.partitioner.make_mesh(devices))
  losses = []
  with jitted.activated():
    frozen, _ = jitted.frozen.load()
    state = jitted.init_state(frozen)
    for step in range(steps):
      state, metrics = jitted.train_step(state, jitted.global_batch(setup.train_data.batch(step)))
      losses.append(float(metrics["loss"]))
  specs = {jax.tree_util.keystr(path): str(sharding.spec) for path, sharding in
           jax.tree_util.tree_flatten_with_path(jitted.sharded_state.shardings.params)[0]}
  return {"losses": losses, "specs": specs}


# Mixtures of experts (issue 44), tiny Mixtral, dropless: the gradients of one batch, and the
# loss, with the experts split over the expert axis (expert parallelism:
# models/moe_parallel.py), against one device.
MOE_MESHES = {"single": {}, "expert4_data2": {"expert": 4, "data": 2},
              "expert2_fsdp2_tensor2": {"expert": 2, "fsdp": 2, "tensor": 2, "data": 1}}
MOE_DECODE_MESHES = {"single": None, "expert4_data2": (2, 1, 1, 4)}
# The all-to-all dispatch (models/moe_parallel.py: the routed rows moved to their experts'
# devices) on the same meshes, at a capacity factor of the expert ways (nothing can drop),
# and at 1.0 (rows dropped: not the single device's function).
MOE_ALL_TO_ALL = {"expert4_data2_all_to_all": ("expert4_data2", 4.0),
                  "expert2_fsdp2_tensor2_all_to_all": ("expert2_fsdp2_tensor2", 2.0),
                  "expert4_data2_all_to_all_drops": ("expert4_data2", 1.0)}


def _mesh_sets(axes):
  return tuple(f"partitioner.ici_{axis}={size}" for axis, size in axes.items())


def _gradients(experiment, axes, extra_sets=(), hlo=False):
  """The loss and the objective's gradients (every parameter, flattened) of one batch of
  `experiment` on one device or a mesh, the JittedSteps, and with `hlo` the per-device HLO
  of its compiled train step on that batch (else None)."""
  from lingvo_lite.training.objectives import lm  # pylint: disable=g-import-not-at-top
  from lingvo_lite.training.objectives.objective import Forward  # pylint: disable=g-import-not-at-top
  setup = synthetic_tiny_setup(experiment, *SETS, *extra_sets, *_mesh_sets(axes))
  devices = jax.devices()[:1] if not axes else jax.devices()
  jitted = JittedSteps(setup, setup.partitioner.make_mesh(devices))
  with jitted.activated():
    state = jitted.init_state()
    batch = jitted.global_batch(setup.train_data.batch(0))

    def objective(params):
      total = jnp.maximum(jnp.sum(batch["weights"]), 1.0)
      value, sums = lm.loss_sums(Forward(setup.model), params, batch, 0.0, total)
      return value, sums["cross_entropy_sum"] / total

    with jax.default_matmul_precision("highest"):
      grads, loss = jax.jit(jax.grad(objective, has_aux=True))(state.params)
    if hlo:
      hlo = jitted.train_step.lower(state, batch).compile().as_text()
  return {"loss": float(loss),
          "grads": {jax.tree_util.keystr(path): np.asarray(leaf).ravel().tolist()
                    for path, leaf in jax.tree_util.tree_flatten_with_path(grads)[0]}
          }, jitted, hlo or None


def _moe_gradients(axes, extra_sets=()):
  """`_gradients` of PyCodeMixtralTiny, with the experts' PartitionSpecs."""
  run, jitted, _ = _gradients("PyCodeMixtralTiny", axes, extra_sets)
  experts = jitted.sharded_state.shardings.params["layer_0"]["mlp"]
  run["specs"] = {name: str(experts[name].spec) for name in ("wi", "wo", "router_kernel")}
  return run


# The residual stream between layers (`activation_embed`, over tensor by default): a tiny
# Llama's scanned, fully rematerialized stack, whose backward keeps each layer's input in one
# stacked buffer [layers, rows, length, width] per device, on one device, data x tensor and
# data x fsdp x tensor (the weights' width over fsdp beside the activations' over tensor).
RESIDUAL_SETS = ("model.scan_layers=True", "model.remat_policy='full'")
RESIDUAL_MESHES = {"single": {}, "data4_tensor2": {"data": 4, "tensor": 2},
                   "data2_fsdp2_tensor2": {"data": 2, "fsdp": 2, "tensor": 2}}


def _residual_stream(axes):
  """`_gradients` of the scanned stack, with the per-device shapes of every 4-d
  dynamic-update-slice of its compiled train step (the scan writing the layer inputs it
  keeps into their stack) and the model's sizes."""
  run, jitted, hlo = _gradients("PyCodeLlamaTiny", axes, RESIDUAL_SETS, hlo=True)
  setup = jitted.setup
  run["stacked"] = sorted(set(re.findall(
      r"= f32\[(\d+,\d+,\d+,\d+)\]\S* dynamic-update-slice\(", hlo)))
  run["sizes"] = {"layers": setup.model.num_layers, "dim": setup.model.dim,
                  "rows": setup.train_data.global_batch_size,
                  "length": setup.train_data.sequence_length}
  return run


# DeepSeek's mixture of experts (issue 55) on the tiny DeepSeek-V3 (latent attention: its
# query, latent and up projections over fsdp and tensor): sigmoid scores, 4 groups of 2
# experts (a token's 2 from its best 2 groups), routed scaling, shared experts, the first
# layer dense, the selection bias moved each step (rate 0.01, no balance loss) and a
# multi-token module trained beside: 3 train steps on 16 devices, data=2 x fsdp=2 x tensor=2 x
# expert=2 (the rows over data x fsdp x expert: what the loads are summed over), against one
# device.
DEEPSEEK_SETS = ("model.router_score='sigmoid'", "model.num_experts=8", "model.expert_groups=4",
                 "model.expert_groups_per_token=2", "model.group_score='top2_sum'",
                 "model.routed_scaling_factor=2.5", "model.shared_expert_mlp_dim=32",
                 "model.first_dense_layers=1", "model.selection_bias=True",
                 "model.selection_bias_rate=0.01", "model.load_balance_coefficient=0.0",
                 "train_data.global_batch_size=16", "eval_data.global_batch_size=16")
DEEPSEEK_MESHES = {"single": {}, "data2_fsdp2_tensor2_expert2": {
    "data": 2, "fsdp": 2, "tensor": 2, "expert": 2}}


def _deepseek_steps(axes):
  """The losses of 3 train steps and each layer's selection bias after them."""
  from lingvo_lite.config import building, fiddlers  # pylint: disable=g-import-not-at-top
  from lingvo_lite.testing import tiny_config  # pylint: disable=g-import-not-at-top
  cfg = tiny_config("PyCodeDeepSeekV3Tiny", *SETS, *DEEPSEEK_SETS, *_mesh_sets(axes),
                    synthetic=True)
  fiddlers.multi_token_prediction(cfg)
  setup = building.build(cfg)
  devices = jax.devices()[:1] if not axes else jax.devices()
  jitted = JittedSteps(setup, setup.partitioner.make_mesh(devices))
  losses, multi_token = [], []
  with jitted.activated(), jax.default_matmul_precision("highest"):
    state = jitted.init_state()
    for step in range(3):
      state, metrics = jitted.train_step(state, jitted.global_batch(setup.train_data.batch(step)))
      losses.append(float(metrics["loss"]))
      multi_token.append(float(metrics["multi_token_loss"]))
  biases = {jax.tree_util.keystr(path): np.asarray(leaf).ravel().tolist()
            for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]
            if "selection_bias" in jax.tree_util.keystr(path)}
  return {"losses": losses, "multi_token": multi_token, "biases": biases}


def main():
  if sys.argv[1:] == ["deepseek"]:
    assert jax.device_count() == 16, jax.device_count()
    json.dump({name: _deepseek_steps(axes) for name, axes in DEEPSEEK_MESHES.items()},
              sys.stdout)
    return
  assert jax.device_count() == 8, jax.device_count()
  result = {"meshes": {name: _losses_and_specs(shape) for name, shape in MESHES.items()}}
  result["splash"] = {
      name: _losses_and_specs(shape, (*SPLASH_SETS, f"model.attention_implementation="
                                      f"'{implementation}'"), steps=3, find_kernel=True)
      for name, (shape, implementation) in SPLASH_MESHES.items()}
  result["families"] = {
      experiment: {name: _losses_and_specs(shape, steps=3, experiment=experiment)["losses"]
                   for name, shape in (("single", None), ("data2_fsdp2_tensor2", (2, 2, 2)))}
      for experiment in DENSE_FAMILIES}
  result["decode"] = {name: _decode_logits(shape) for name, shape in DECODE_MESHES.items()}
  result["decode"]["data4_tensor2_positions"] = _decode_by_position(DECODE_MESHES["data4_tensor2"])
  result["decode_kernel"] = _decode_kernel_on_a_mesh()
  result["decode_int8_weights"] = {name: _decode_logits(shape, INT8_WEIGHTS)
                                   for name, shape in INT8_WEIGHTS_MESHES.items()}
  result["qlora"] = {name: _lora_losses(shape) for name, shape in LORA_MESHES.items()}
  result["moe"] = {name: _moe_gradients(axes) for name, axes in MOE_MESHES.items()}
  result["moe"].update({
      name: _moe_gradients(MOE_MESHES[mesh], ("model.dispatch='all_to_all'",
                                              f"model.capacity_factor={factor}"))
      for name, (mesh, factor) in MOE_ALL_TO_ALL.items()})
  result["residual"] = {name: _residual_stream(axes) for name, axes in RESIDUAL_MESHES.items()}
  result["moe_decode"] = {name: _decode_logits(shape, experiment="PyCodeMixtralTiny")
                          for name, shape in MOE_DECODE_MESHES.items()}
  result["bad"] = {}
  with tempfile.TemporaryDirectory() as job:
    for name, args in BAD_PARTITIONING.items():
      outcome = run_cli(["--exp=PyCodeLlamaTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
                         f"--job_log_dir={job}/{name}", *args])
      result["bad"][name] = {"code": outcome.code, "stderr": outcome.stderr}
  json.dump(result, sys.stdout)


if __name__ == "__main__":
  main()
