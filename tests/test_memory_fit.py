"""The train and eval programs refuse arrays that cannot fit this host's devices, from shapes
alone; the shapes come from the model's own count and a one-layer trace."""

import dataclasses
import math
import types

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from experiments.lm import architectures
from lingvo_lite import memory_fit
from lingvo_lite.errors import UsageError
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.testing import run_cli, synthetic_tiny_setup
from tests.trained_jobs import tree_digest

_FAMILIES = {"gptj": architectures.gptj, "llama": architectures.llama,
             "gpt2": architectures.gpt2}


@pytest.mark.parametrize("family", sorted(_FAMILIES))
@pytest.mark.parametrize("fields", [
    {}, {"scan_layers": True},
    {"num_kv_heads": 2, "attention_bias": True, "mlp_bias": True, "embedding_bias": True,
     "output_bias": True, "tie_embeddings": False, "norm": "rmsnorm", "position": "learned",
     "max_length": 32}])
def test_the_analytic_count_and_the_one_layer_shapes_match_the_initialized_model(family, fields):
  model = fdl.build(_FAMILIES[family](vocab_size=50, num_layers=3, dim=16, num_heads=4,
                                      **fields))
  tokens = jax.ShapeDtypeStruct((1, 4), jnp.int32)
  params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens)["params"])
  leaves = jax.tree.leaves(params)
  assert model.num_parameters() == sum(math.prod(x.shape) for x in leaves)
  shapes = model.parameter_shapes()
  assert sum(math.prod(p.shape) * p.repeats for p in shapes) == model.num_parameters()
  assert sum(p.repeats for p in shapes) == len(leaves)


def test_a_tiny_state_fits_and_is_counted_per_device():
  setup = synthetic_tiny_setup()
  memory_fit.check_fits(setup)
  need = memory_fit.per_device_need(setup, 1)
  assert need.parameters == 4 * setup.model.num_parameters()  # float32
  assert need.gradients == need.parameters and need.moments == 2 * need.parameters


@pytest.mark.parametrize("moment_dtype, offload", [("bfloat16", False), (None, True),
                                                   ("bfloat16", True), ("float32", False)])
def test_the_moments_are_counted_in_their_dtype_and_where_they_are_kept(moment_dtype, offload):
  """optimizer.moment_dtype sizes the two Adam moments (2 bytes an element in bfloat16);
  optimizer.offload_state keeps them in host memory: counted apart, not in the device's
  total. On 8 devices with FSDP every shard shrinks alike."""
  setup = synthetic_tiny_setup()
  count = setup.model.num_parameters()
  changed = dataclasses.replace(setup, optimizer=dataclasses.replace(
      setup.optimizer, moment_dtype=moment_dtype, offload_state=offload))
  plain, need = memory_fit.per_device_need(setup, 1), memory_fit.per_device_need(changed, 1)
  moments = 2 * count * (2 if moment_dtype == "bfloat16" else 4)  # The float32 model's.
  assert (need.moments, need.host_moments) == ((0, moments) if offload else (moments, 0))
  assert need.total == plain.total - plain.moments + need.moments
  assert (need.parameters, need.gradients) == (plain.parameters, plain.gradients)
  fsdp = Partitioner(ici_data=1, ici_fsdp=-1)
  sharded = memory_fit.per_device_need(dataclasses.replace(changed, partitioner=fsdp), 8)
  whole = memory_fit.per_device_need(dataclasses.replace(setup, partitioner=fsdp), 8)
  in_bfloat16 = whole.moments // 2 if moment_dtype == "bfloat16" else whole.moments
  assert sharded.moments + sharded.host_moments == in_bfloat16 < moments


def test_a_refusal_names_host_moments_and_the_moment_settings(monkeypatch):
  """An accelerator's refusal of a state too large says what the host holds and which
  optimizer settings take moments off the device (offload only where there is a host apart
  from the device, and neither once they are taken)."""
  setup = synthetic_tiny_setup()
  need = memory_fit.per_device_need(setup, 1)
  gpu = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H200",
                              memory_stats=lambda: {"bytes_limit": need.state // 8})
  monkeypatch.setattr(jax, "local_devices", lambda: [gpu])
  with pytest.raises(UsageError) as error:
    memory_fit.check_fits(setup)
  assert ("; or --fdl.optimizer.moment_dtype='bfloat16' (half the moments' bytes) or "
          "--fdl.optimizer.offload_state=True (the moments in host memory)") in str(error.value)
  offloaded = dataclasses.replace(setup, optimizer=dataclasses.replace(
      setup.optimizer, moment_dtype="bfloat16", offload_state=True))
  with pytest.raises(UsageError) as error:
    memory_fit.check_fits(offloaded)
  text = str(error.value)
  host = 2 * 2 * setup.model.num_parameters()  # bfloat16 mu and nu.
  breakdown = text.split("(per device, in one training step: ")[1].split(")")[0]
  assert breakdown.endswith(f"; optimizer moments in host memory {host / 2**20:.3g} MiB"), text
  assert "optimizer moments" not in breakdown.split(";")[0]  # None on the device.
  assert "--fdl.optimizer" not in text
  monkeypatch.setattr(memory_fit, "host_available_bytes", lambda: need.state // 8)
  monkeypatch.setattr(jax, "local_devices", jax.devices)  # A CPU: its RAM is the host's.
  with pytest.raises(UsageError) as error:
    memory_fit.check_fits(setup)
  assert ("; or --fdl.optimizer.moment_dtype='bfloat16' (half the moments' bytes)"
          in str(error.value) and "offload_state" not in str(error.value))


def test_fsdp_divides_each_device_s_share():
  setup = synthetic_tiny_setup()
  replicated = memory_fit.per_device_need(setup, 8)
  fsdp = memory_fit.per_device_need(
      dataclasses.replace(setup, partitioner=Partitioner(ici_data=1, ici_fsdp=-1)), 8)
  assert replicated.parameters == 4 * setup.model.num_parameters()
  # Everything but the norms' scales and offsets is split 8 ways over `embed`.
  assert fsdp.parameters < replicated.parameters / 6


def test_an_accelerator_is_compared_with_its_own_memory(monkeypatch):
  setup = synthetic_tiny_setup()
  need = memory_fit.per_device_need(setup, 1).total

  def fake_gpu(limit):
    stats = {"bytes_limit": limit} if limit else None
    return types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H200",
                                 memory_stats=lambda: stats)
  monkeypatch.setattr(jax, "local_devices", lambda: [fake_gpu(need // 2)])
  with pytest.raises(UsageError, match=r"do not fit: .* of each NVIDIA H200 .* and it has"):
    memory_fit.check_fits(setup)
  monkeypatch.setattr(jax, "local_devices", lambda: [fake_gpu(need * 2)])
  memory_fit.check_fits(setup)
  monkeypatch.setattr(jax, "local_devices", lambda: [fake_gpu(None)])
  memory_fit.check_fits(setup)  # A runtime that does not say: not refused.


def test_training_a_7b_model_on_a_small_host_is_one_line_but_printing_it_works(tmp_path,
                                                                              monkeypatch):
  monkeypatch.setattr(memory_fit, "host_available_bytes", lambda: 16 * 2**30)
  monkeypatch.chdir(tmp_path)
  before = tree_digest(tmp_path)
  result = run_cli(["--exp=Llama7B", f"--job_log_dir={tmp_path / 'llama'}"])
  lines = result.stderr.strip().splitlines()
  assert result.code == 2 and len(lines) == 1, result.stderr
  # 75 GiB of parameters and moments and, for an eval batch of 256 x 2048 tokens (training
  # takes its 256 rows as 16 micro-batches), 128 GiB of one layer's attention scores.
  assert lines[0].startswith("lingvo_lite: error: model: 6.74B parameters (num_layers=32, "
                             "dim=4096) with eval_data batches of 256 x 2048 tokens do not "
                             "fit: training needs at least 266 GiB"), lines[0]
  assert "attention scores 128 GiB) and 16 GiB is available; use fewer layers " in lines[0]
  assert "; use a smaller eval_data.global_batch_size or eval_data.sequence_length" in lines[0]
  assert tree_digest(tmp_path) == before
  printed = run_cli(["--mode=print", "--exp=Llama7B"])
  assert printed.code == 0, printed.stderr
  assert "model.num_layers = 32" in printed.stdout


def _with_data(setup, name, **fields):
  return dataclasses.replace(setup, **{name: dataclasses.replace(getattr(setup, name),
                                                                 **fields)})


def test_one_layer_of_einsum_attention_scores_is_counted_and_other_implementations_not():
  setup = synthetic_tiny_setup()
  data, model = setup.train_data, setup.model
  need = memory_fit.per_device_need(setup, 1)
  assert model.resolved_attention_implementation() == "einsum"  # "auto" on a CPU.
  assert need.attention == 4 * data.global_batch_size * model.num_heads * data.sequence_length**2
  accumulated = dataclasses.replace(setup, train=dataclasses.replace(setup.train,
                                                                     grad_accum_steps=2))
  assert memory_fit.per_device_need(accumulated, 1).attention == need.attention // 2
  # jax.nn.dot_product_attention may fuse them away: not counted, so the bound stays low.
  other = dataclasses.replace(setup, model=model.clone(attention_implementation="xla"))
  assert memory_fit.per_device_need(other, 1).attention == 0
  # Split over the batch's mesh axis like the batch: 8 data-parallel devices hold 1/8 each
  # (4 rows over 8 devices: at least one row each).
  assert memory_fit.per_device_need(_with_data(setup, "train_data", global_batch_size=16),
                                    8).attention == need.attention // 2


def test_the_eval_program_needs_the_parameters_and_one_eval_step():
  setup = _with_data(synthetic_tiny_setup(), "eval_data", global_batch_size=64)
  need = memory_fit.eval_need(setup, 1)
  train = memory_fit.per_device_need(setup, 1)
  assert (need.parameters, need.gradients, need.moments) == (train.parameters, 0, 0)
  length, vocab = setup.eval_data.sequence_length, setup.model.vocab_size
  assert need.batch == 12 * 64 * length + 4 * 64 * length * vocab
  assert need.attention == 4 * 64 * setup.model.num_heads * length**2
  # Within training, an eval step this large is the peak: state without gradients.
  assert (train.step, train.gradients, train.moments) == ("eval step", 0, 2 * train.parameters)
  assert train.total == need.total + train.moments


@pytest.mark.parametrize("name, fields, check, message", [
    ("eval_data", {"global_batch_size": 2_000_000}, memory_fit.check_eval_fits,
     "with eval_data batches of 2000000 x 64 tokens do not fit: eval needs at least"),
    ("eval_data", {"sequence_length": 60_000}, memory_fit.check_eval_fits,
     "with eval_data batches of 4 x 60000 tokens do not fit: eval needs at least"),
    ("train_data", {"sequence_length": 30_000}, memory_fit.check_fits,
     "with train_data batches of 4 x 30000 tokens do not fit: training needs at least"),
    ("eval_data", {"global_batch_size": 2_000_000}, memory_fit.check_fits,
     "(per device, in one eval step: parameters"),
])
def test_activations_too_large_for_the_host_are_one_usage_error(monkeypatch, name, fields,
                                                                check, message):
  monkeypatch.setattr(memory_fit, "host_available_bytes", lambda: 16 * 2**30)
  setup = _with_data(synthetic_tiny_setup(), name, **fields)
  with pytest.raises(UsageError) as error:
    check(setup)
  text = str(error.value)
  assert message in text and "attention scores" in text, text
  assert f"use a smaller {name}.global_batch_size or {name}.sequence_length" in text
  assert "use fewer layers" not in text  # The 0.13M parameters are not the problem.
  memory_fit.check_eval_fits(synthetic_tiny_setup())


def test_the_decode_bound_counts_the_kv_cache_as_its_family_sizes_it():
  """One count of the cache's bytes (the family's `cache_bytes`) for the decode program's
  check and the compile report, here against keys and values counted by hand, whole and split
  over 8 data-parallel devices (the slots) and over 2 tensor ones (the key/value heads)."""
  setup = synthetic_tiny_setup("PyCodeLlamaTiny", "decode.slots=8", "decode.cache_length=48")
  model = setup.model
  layers, kv_heads, head_dim = model.num_layers, model.num_kv_heads, model.dim // model.num_heads
  assert (layers, kv_heads, head_dim) == (2, 2, 16)
  by_hand = 2 * layers * 8 * kv_heads * 48 * head_dim * 4  # keys and values, float32
  assert memory_fit.decode_need(setup, 1)["KV cache"] == by_hand == model.cache_bytes(8, 48)
  assert memory_fit.decode_need(setup, 8)["KV cache"] == by_hand // 8
  tensor = dataclasses.replace(setup, partitioner=Partitioner(ici_data=4, ici_tensor=2))
  assert memory_fit.decode_need(tensor, 8)["KV cache"] == by_hand // 8
