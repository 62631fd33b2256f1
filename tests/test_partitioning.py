"""Sharding over a device mesh: equal losses on every mesh, the PartitionSpecs each parameter
gets, and one-line errors for partitioning settings that cannot work.

The multi-device part runs tests/multidevice_worker.py in a child process with 8 forced CPU
devices (the device count is fixed when JAX starts, and this process keeps one device), and
once more with 16 for a mesh of every axis at 2.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from lingvo_lite.errors import UsageError
from lingvo_lite.partitioning import Partitioner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_worker(devices, *args):
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
  completed = subprocess.run([sys.executable, "-m", "tests.multidevice_worker", *args],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                             check=False)
  assert completed.returncode == 0, completed.stderr[-3000:]
  return json.loads(completed.stdout)


@pytest.fixture(scope="module", name="worker")
def fixture_worker():
  return _run_worker(8)


@pytest.fixture(scope="module", name="deepseek_worker")
def fixture_deepseek_worker():
  """The worker on 16 devices: every mesh axis at 2 (issue 55's DeepSeek-style MoE)."""
  return _run_worker(16, "deepseek")


def _layer_specs(attention_in, attention_out, mlp_in, mlp_out):
  specs = {}
  for layer in ("layer_0", "layer_1"):
    for name in ("query_kernel", "key_kernel", "value_kernel"):
      specs[f"['{layer}']['attention']['{name}']"] = attention_in
    specs[f"['{layer}']['attention']['out_kernel']"] = attention_out
    specs[f"['{layer}']['mlp']['wi']['kernel']"] = mlp_in
    specs[f"['{layer}']['mlp']['wi_gate']['kernel']"] = mlp_in
    specs[f"['{layer}']['mlp']['wo']['kernel']"] = mlp_out
    specs[f"['{layer}']['attention_norm']['scale']"] = "P()"
    specs[f"['{layer}']['mlp_norm']['scale']"] = "P()"
  return specs


EXPECTED_SPECS = {
    "data8": {"['embedding']": "P()", "['final_norm']['scale']": "P()",
              "['output']['kernel']": "P()", **_layer_specs("P()", "P()", "P()", "P()")},
    "fsdp8": {"['embedding']": "P(None, 'fsdp')", "['final_norm']['scale']": "P()",
              "['output']['kernel']": "P('fsdp',)",
              **_layer_specs("P('fsdp',)", "P(None, None, 'fsdp')", "P('fsdp',)",
                             "P(None, 'fsdp')")},
    "data2_fsdp2_tensor2": {
        "['embedding']": "P('tensor', 'fsdp')", "['final_norm']['scale']": "P()",
        "['output']['kernel']": "P('fsdp', 'tensor')",
        **_layer_specs("P('fsdp', 'tensor')", "P('tensor', None, 'fsdp')",
                       "P('fsdp', 'tensor')", "P('tensor', 'fsdp')")},
}


@pytest.mark.parametrize("mesh", sorted(EXPECTED_SPECS))
def test_losses_on_a_mesh_equal_the_single_device_run(worker, mesh):
  single = worker["meshes"]["single"]["losses"]
  sharded = worker["meshes"][mesh]["losses"]
  assert len(sharded) == 5 and worker["meshes"][mesh]["finite"]
  np.testing.assert_allclose(sharded, single, rtol=1e-5)


def test_flash_attention_on_a_mesh_equals_the_einsum_attention_on_one_device(worker):
  """The splash kernel placed per shard (rows over data x fsdp, heads over tensor) trains
  as the written-out attention does on one device; the kernel is in the step."""
  einsum, splash = (worker["splash"][name] for name in ("einsum_single",
                                                        "splash_data2_fsdp2_tensor2"))
  assert splash["kernel"] and not einsum["kernel"]
  assert len(splash["losses"]) == 3 and splash["finite"]
  np.testing.assert_allclose(splash["losses"], einsum["losses"], rtol=1e-5)


@pytest.mark.parametrize("experiment", ["PyCodeGemma3Tiny", "PyCodeOlmo3Tiny",
                                        "PyCodeQwen3Tiny"])
def test_tiny_dense_families_train_on_a_mesh_as_on_one_device(worker, experiment):
  """Sliding and full layers, query and key norms (per head; over the whole projection,
  whose heads the tensor axis splits) and sandwich or post-norm blocks: 3 steps on
  data=2 x fsdp=2 x tensor=2 give one device's losses."""
  losses = worker["families"][experiment]
  assert len(losses["single"]) == 3 and np.isfinite(losses["data2_fsdp2_tensor2"]).all()
  np.testing.assert_allclose(losses["data2_fsdp2_tensor2"], losses["single"], rtol=1e-5)


_EXPERT4_DATA2_SPECS = {"wi": "P('expert',)", "wo": "P('expert',)",
                       "router_kernel": "P(None, 'expert')"}
_EXPERT2_FSDP2_TENSOR2_SPECS = {"wi": "P('expert', 'fsdp', 'tensor')",
                                "wo": "P('expert', 'tensor', 'fsdp')",
                                "router_kernel": "P('fsdp', 'expert')"}


@pytest.mark.parametrize("mesh, specs", [
    ("expert4_data2", _EXPERT4_DATA2_SPECS),
    ("expert2_fsdp2_tensor2", _EXPERT2_FSDP2_TENSOR2_SPECS),
    ("expert4_data2_all_to_all", _EXPERT4_DATA2_SPECS),
    ("expert2_fsdp2_tensor2_all_to_all", _EXPERT2_FSDP2_TENSOR2_SPECS)])
def test_expert_parallel_gradients_equal_the_single_device_ones(worker, mesh, specs):
  """A tiny Mixtral's loss and every parameter's gradient of one batch, its experts split
  over the expert axis (each expert group's devices gather their tokens, run their own
  experts and sum the outputs back; or, `_all_to_all`, each device moves its routed rows to
  their experts' devices and back, at a capacity factor that drops nothing:
  models/moe_parallel.py) and combined with data, fsdp and tensor parallelism, equal one
  device's within 1e-5."""
  single, sharded = worker["moe"]["single"], worker["moe"][mesh]
  shown = lambda run: {k: v.replace("PartitionSpec", "P") for k, v in run["specs"].items()}
  assert shown(sharded) == specs and shown(single)["wi"] == "P()"
  np.testing.assert_allclose(sharded["loss"], single["loss"], rtol=1e-5)
  assert set(sharded["grads"]) == set(single["grads"])
  scale = max(np.abs(values).max() for values in single["grads"].values())
  for path, values in single["grads"].items():
    np.testing.assert_allclose(sharded["grads"][path], values, rtol=1e-5, atol=1e-5 * scale,
                               err_msg=path)


@pytest.mark.parametrize("mesh", ["data4_tensor2", "data2_fsdp2_tensor2"])
def test_the_residual_stream_is_split_over_tensor_with_one_devices_gradients(worker, mesh):
  """A scanned, fully rematerialized stack on data=4 x tensor=2 and data=2 x fsdp=2 x
  tensor=2: the layer inputs its backward keeps are stacked per device as [layers, rows / 4,
  length, width / tensor] (`activation_embed` -> tensor), not at the whole width as each of a
  tensor group's devices kept them before; the loss and every parameter's gradient of one
  batch equal one device's within 1e-5."""
  single, sharded = worker["residual"]["single"], worker["residual"][mesh]
  sizes = sharded["sizes"]
  layers, rows, length, dim = (sizes[k] for k in ("layers", "rows", "length", "dim"))
  # One device keeps the whole stack: the shape the sharded one is compared by.
  assert f"{layers},{rows},{length},{dim}" in single["stacked"], single["stacked"]
  assert f"{layers},{rows // 4},{length},{dim // 2}" in sharded["stacked"], sharded["stacked"]
  assert f"{layers},{rows // 4},{length},{dim}" not in sharded["stacked"], sharded["stacked"]
  np.testing.assert_allclose(sharded["loss"], single["loss"], rtol=1e-5)
  assert set(sharded["grads"]) == set(single["grads"])
  scale = max(np.abs(values).max() for values in single["grads"].values())
  for path, values in single["grads"].items():
    np.testing.assert_allclose(sharded["grads"][path], values, rtol=1e-5, atol=1e-5 * scale,
                               err_msg=path)


def test_the_all_to_all_dispatch_drops_rows_past_its_capacity(worker):
  """At a capacity factor of 1 (each expert shard takes a device's fair share of its rows),
  the all-to-all dispatch of the same batch drops rows, so its loss is not one device's: the
  factor bounds what moves (the equality above is not the capacity's doing)."""
  single, dropping = worker["moe"]["single"], worker["moe"]["expert4_data2_all_to_all_drops"]
  assert np.isfinite(dropping["loss"])
  assert abs(dropping["loss"] - single["loss"]) > 1e-4 * abs(single["loss"])


def test_decode_with_experts_sharded_gives_the_logits_of_one_device(worker):
  """Slots over data x expert (8 ways), the experts over 4 of them: each step's logits as on
  one device."""
  runs = worker["moe_decode"]
  _assert_same_logits_while_tokens_agree(runs["single"], runs["expert4_data2"])


def test_deepseek_moe_trains_on_a_mesh_as_on_one_device(deepseek_worker):
  """DeepSeek's routing (sigmoid, groups, scaling, shared experts, a dense first layer), its
  selection bias moved each step by the step's loads and a multi-token module: 3 steps on
  data=2 x fsdp=2 x tensor=2 x expert=2 (16 devices) give one device's losses, and the same
  biases (a load counted differently would move a bias the other way)."""
  single, sharded = deepseek_worker["single"], deepseek_worker["data2_fsdp2_tensor2_expert2"]
  np.testing.assert_allclose(sharded["losses"], single["losses"], rtol=1e-5)
  np.testing.assert_allclose(sharded["multi_token"], single["multi_token"], rtol=1e-5)
  assert set(sharded["biases"]) == set(single["biases"]) and single["biases"]
  for path, values in single["biases"].items():
    assert np.abs(values).max() > 0, path  # The biases moved.
    np.testing.assert_allclose(sharded["biases"][path], values, atol=1e-6, err_msg=path)


@pytest.mark.parametrize("mesh", sorted(EXPECTED_SPECS))
def test_parameter_partition_specs(worker, mesh):
  got = {path: spec.replace("PartitionSpec", "P") for path, spec in
         worker["meshes"][mesh]["specs"].items()}
  assert got == EXPECTED_SPECS[mesh]
  assert worker["meshes"][mesh]["moments_match"]


@pytest.mark.parametrize("case, message", [
    ("mesh_vs_devices", "the mesh has 3 devices but 8 are available"),
    ("batch_vs_data_parallel",
     "train_data.global_batch_size=4: must split evenly over the data-parallel size 8"),
    ("dimension_vs_axis", "the 'vocab' dimension of parameter ['embedding'] is not divisible "
                          "by mesh axes tensor = 8"),
    ("unknown_logical_axis", "partitioner.rules='embd': unknown logical axis name"),
    ("unknown_mesh_axis", "partitioner.rules='batch -> dp': unknown mesh axis"),
])
def test_bad_partitioning_is_a_one_line_error(worker, case, message):
  outcome = worker["bad"][case]
  assert outcome["code"] == 2
  lines = outcome["stderr"].strip().splitlines()
  assert len(lines) == 1 and message in lines[0], outcome["stderr"]


def _assert_same_logits_while_tokens_agree(single, sharded):
  """Each step's logits, compared while a slot's tokens agree (a near-tie of random weights
  may pick another token; then the rest of that slot differs by design)."""
  compared = 0
  for slot in range(8):
    for step, (one, many) in enumerate(zip(single["logits"], sharded["logits"])):
      np.testing.assert_allclose(many[slot], one[slot], rtol=1e-4, atol=1e-4)
      compared += 1
      # The next step feeds the token this one sampled.
      position = [1, 3, 5, 7, 9, 11, 13, 15][slot] + step + 1
      if single["tokens"][slot][position] != sharded["tokens"][slot][position]:
        break
  assert compared >= 60  # Most of the 80 slot-steps: the tokens agree almost everywhere.


def test_sharded_decode_gives_the_logits_of_one_device(worker):
  """Slots over 4 data-parallel devices and key/value heads over 2 tensor devices: each
  step's logits as on one device."""
  single, sharded = worker["decode"]["single"], worker["decode"]["data4_tensor2"]
  # A layer's [slots, kv_heads, length, head_dim]: slots over data, heads over tensor.
  assert sharded["cache_spec"] == str(PartitionSpec("data", "tensor"))
  _assert_same_logits_while_tokens_agree(single, sharded)
  # The cache by position (forced; a TPU's where the paged kernel does not decode): [slots,
  # length, kv_heads * head_dim], the merged heads over tensor, whole heads on each device.
  by_position = worker["decode"]["data4_tensor2_positions"]
  assert by_position["cache_spec"] == str(PartitionSpec("data", None, "tensor"))
  _assert_same_logits_while_tokens_agree(single, by_position)


def test_the_decode_kernel_placed_per_shard_equals_one_device(worker):
  """models/decode_attention.py under data=4 x tensor=2: each device runs the kernel on its
  slots and heads (a shard_map), with the outputs of one device."""
  run = worker["decode_kernel"]
  assert run["per_shard"] and run["output_spec"] == str(PartitionSpec("data", "tensor"))
  assert run["max_difference"] <= 1e-6, run


def test_int8_weights_decode_sharded_as_on_one_device(worker):
  """int8 weights on data=2 x fsdp=2 x tensor=2: a query kernel's int8 values split as the
  float kernel is ([embed, heads, kv]: fsdp, tensor), its scales [1, heads, kv] over tensor
  only; each step's logits as on one device."""
  runs = worker["decode_int8_weights"]
  sharded = runs["data2_fsdp2_tensor2"]
  assert sharded["query_specs"] == [str(PartitionSpec("fsdp", "tensor")),
                                    str(PartitionSpec(None, "tensor"))]
  _assert_same_logits_while_tokens_agree(runs["single"], sharded)


def test_qlora_trains_on_a_mesh_as_on_one_device(worker):
  """QLoRA steps (float adapters over int8 weights) on data=2 x fsdp=2 x tensor=2 give the
  single device's losses, and each adapter is split as its kernel's axes are: A [in..., r]
  over the kernel's input axes, B [r, out...] over its output axes (the query kernel
  [embed, heads, kv]: fsdp, tensor)."""
  single, sharded = (worker["qlora"][name] for name in ("single", "data2_fsdp2_tensor2"))
  assert single["losses"][-1] < single["losses"][0]  # The adapters learn.
  np.testing.assert_allclose(sharded["losses"], single["losses"], rtol=1e-5)
  query = "['layer_0']['attention']['query_kernel"
  assert (sharded["specs"][f"{query}_lora_a']"], sharded["specs"][f"{query}_lora_b']"]) == (
      str(PartitionSpec("fsdp")), str(PartitionSpec(None, "tensor")))
  mlp_out = "['layer_0']['mlp']['wo']['kernel"
  assert (sharded["specs"][f"{mlp_out}_lora_a']"], sharded["specs"][f"{mlp_out}_lora_b']"]) == (
      str(PartitionSpec("tensor")), str(PartitionSpec(None, "fsdp")))


def test_one_axis_takes_the_remaining_devices():
  assert Partitioner(ici_data=-1, ici_tensor=2).resolved_ici_shape(8) == (1, 4, 1, 1, 2)
  assert Partitioner(ici_data=1, ici_fsdp=-1, dcn_data=2).mesh_axis_sizes(8) == {
      "stage": 1, "data": 2, "fsdp": 4, "expert": 1, "tensor": 1}
  with pytest.raises(UsageError, match="at most one mesh axis may be -1"):
    Partitioner(ici_data=-1, ici_fsdp=-1).resolved_ici_shape(8)
  with pytest.raises(UsageError, match="do not divide the 8 devices"):
    Partitioner(ici_data=-1, ici_tensor=3).resolved_ici_shape(8)


def test_single_device_mesh_and_batch_sharding():
  partitioner = Partitioner()
  mesh = partitioner.make_mesh(jax.devices()[:1])
  assert dict(mesh.shape) == {"stage": 1, "data": 1, "fsdp": 1, "expert": 1, "tensor": 1}
  assert partitioner.data_parallel_size({"stage": 1, "data": 4, "fsdp": 2, "expert": 1, "tensor": 2}) == 8


@pytest.mark.parametrize("target, message", [
    (3, "partitioner.rules=('batch', 3): a rule maps a logical axis to None, a mesh axis name "
        "or a tuple of mesh axis names; e.g. ('batch', 'data')"),
    ({"data": 1}, "partitioner.rules=('batch', {'data': 1}): a rule maps"),
    (("data", None), "partitioner.rules=('batch', ('data', None)): a rule maps"),
    (("fsdp", "fsdp"), "partitioner.rules=('batch', ('fsdp', 'fsdp')): names a mesh axis twice"),
    ("dp", "partitioner.rules='batch -> dp': unknown mesh axis"),
])
def test_rule_targets_are_checked_before_anything_is_sharded(target, message):
  rules = tuple((name, target if name == "batch" else rule) for name, rule in
                Partitioner().rules)
  with pytest.raises(UsageError) as error:
    Partitioner(rules=rules).check_rules({"batch"})
  assert str(error.value).startswith(message), str(error.value)
  Partitioner().check_rules({"batch"})  # The default rules pass.


@pytest.mark.parametrize("rules, message", [
    # The batch's rule first: the activations' width would silently stay whole.
    ({"activation_embed": "fsdp"}, "partitioner.rules='batch -> fsdp, activation_embed -> "
                                   "fsdp': the activations between layers"),
    # Its rule first: the batch would lose `data` on every activation.
    ({"activation_embed": ("tensor", "data")}, "partitioner.rules='batch -> data, "
                                               "activation_embed -> data'"),
    ({"length": "tensor"}, "partitioner.rules='length -> tensor, activation_embed -> tensor'"),
])
def test_the_residual_streams_dimensions_take_distinct_mesh_axes(rules, message):
  with pytest.raises(UsageError) as error:
    Partitioner(rules=tuple((name, rules.get(name, target))
                            for name, target in Partitioner().rules)).check_rules({"batch"})
  assert str(error.value).startswith(message), str(error.value)
  assert "map 'activation_embed' to a mesh axis" in str(error.value)
  # A fallback rule (Flax tries a logical axis's rules in order) is the user's choice; no
  # rule for the width keeps it whole (as a job's saved rules from before it had one).
  Partitioner(rules=(*Partitioner().rules, ("activation_embed", None))).check_rules(set())
  Partitioner(rules=tuple(r for r in Partitioner().rules if r[0] != "activation_embed")
              ).check_rules({"batch"})
