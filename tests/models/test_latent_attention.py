"""Multi-head latent attention (models/latent_attention.py) and the transformer built on it:

- the absorbed decode (a cache of latents and rotary keys, the up projections folded into the
  query and the output) equals the expanded forward under teacher forcing within 1e-5, for
  both DeepSeek families, unrolled and scanned, with LoRA adapters on every projection and
  with int8 weights;
- its cache holds kv_lora_rank + qk_rope_head_dim values per token and layer, measured from
  the cache the family makes, beside a grouped-query model of the same width;
- training through the kernels table: splash (interpreted) takes values of another width
  than the keys', and a row that takes one width gets them padded, both equal to the einsum
  row, forward and gradients;
- LoRA's default targets adapt every latent projection;
- a bad config is one line naming its field, exit 2.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite import target
from lingvo_lite.errors import UsageError
from lingvo_lite.models import lora
from lingvo_lite.models.deepseek_v2 import DeepSeekV2
from lingvo_lite.models.deepseek_v3 import DeepSeekV3
from lingvo_lite.models.latent_attention import LatentAttention
from lingvo_lite.models.llama import Llama
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.testing import run_cli
from tests.models.references import assert_decode_equals_teacher_forcing

# Small latent sizes of their own: values narrower than the keys (16 + 8 against 12), a
# bottleneck on V3's queries, one dense layer, then experts in groups.
SIZES = dict(vocab_size=48, num_layers=2, dim=32, num_heads=4, kv_lora_rank=16,
             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, mlp_dim=40,
             expert_mlp_dim=16, shared_expert_mlp_dim=16, num_experts=4,
             experts_per_token=2, first_dense_layers=1, max_length=64,
             rotary_scaling="none")
MODELS = {
    "v3": lambda **f: DeepSeekV3(**{**SIZES, "q_lora_rank": 24, "expert_groups": 2,
                                    "expert_groups_per_token": 1, **f}),
    "v2": lambda **f: DeepSeekV2(**{**SIZES, "v_head_dim": 40, **f}),
}


def _params(model, length=16):
  variables = model.init(jax.random.key(0), jnp.zeros((1, length), jnp.int32))
  return nn.meta.unbox(variables)


def _sequences(total=20):
  return jax.random.randint(jax.random.key(7), (2, total), 0, SIZES["vocab_size"])


class _Adapted:
  """A LoRA model's decode methods with its adapters in every apply."""

  def __init__(self, model, adapters):
    self.model, self.adapters = model, adapters

  def __getattr__(self, attribute):
    return getattr(self.model, attribute)

  def apply(self, variables, *args, **kwargs):
    return self.model.apply({**variables, lora.COLLECTION: self.adapters}, *args, **kwargs)

  def prefill(self, params, *args):
    return type(self.model).prefill(self, params, *args)

  def extend(self, params, *args):
    return type(self.model).extend(self, params, *args)


def test_the_absorbed_decode_equals_the_expanded_forward():
  """V3: scanned layers (the cache stacked), YaRN with DeepSeek's magnitudes, LoRA adapters
  on every projection (the up projection's merged into the absorbed matmuls); V2: unrolled,
  int8 weights (dequantized in the absorbed matmuls as the expanded form's)."""
  # Dense layers (the experts are the feed-forward's, decoded as they are trained).
  v3 = MODELS["v3"](scan_layers=True, rotary_scaling="yarn", rotary_scaling_factor=4.0,
                    rotary_original_max_length=16, rotary_mscale_all_dim=0.8,
                    first_dense_layers=2)
  adapted = v3.with_adapters(lora.LoraSettings(rank=4))
  variables = _params(adapted)
  # B starts at zero: nonzero adapters, or the case would pass without them.
  adapters = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(3), x.shape),
                          variables[lora.COLLECTION])
  v2 = MODELS["v2"](first_dense_layers=2)
  int8 = v2.clone(quantization="int8_weights")
  quantized = int8.decode_params(_params(v2)["params"], v2.parameter_logical_specs())
  with jax.default_matmul_precision("highest"):
    assert_decode_equals_teacher_forcing(_Adapted(adapted, adapters), variables["params"],
                                         _sequences(), adapted.empty_cache(2, 24))
    assert_decode_equals_teacher_forcing(int8, quantized, _sequences(),
                                         int8.empty_cache(2, 24))


def test_the_cache_holds_the_latent_and_the_rotary_key_per_token():
  """Measured from the arrays the families make: (kv_lora_rank + qk_rope_head_dim) x layers
  values per token; beside, a grouped-query model of the same width and heads (8 key/value
  heads of 128, as Llama 3 70B's) and the heads' expanded keys and values."""
  model = MODELS["v3"]()
  cache = model.empty_cache(2, 24)
  stored = sum(x.size for x in jax.tree.leaves(cache))
  assert stored == 2 * 24 * 2 * (16 + 8)  # Slots x entries x layers x (latent + key).
  assert model.cache_bytes(2, 24) == stored * 4
  # At DeepSeek-V3's sizes, from the shapes alone (the README's numbers).
  v3 = DeepSeekV3(dtype="bfloat16")
  per_token = v3.cache_bytes(1, 4096) / 4096
  assert per_token == 61 * (512 + 64) * 2 == 70272
  gqa = Llama(vocab_size=129280, num_layers=61, dim=7168, num_heads=128, num_kv_heads=8,
              head_dim=128, dtype="bfloat16")
  assert gqa.cache_bytes(1, 4096) / 4096 == 61 * 2 * 8 * 128 * 2 == 249856
  expanded = 61 * 128 * (192 + 128) * 2
  assert (expanded, round(expanded / per_token, 1)) == (4997120, 71.1)


def _layer(implementation, value_width):
  return LatentAttention(num_heads=2, num_kv_heads=2, head_dim=24, rotary_dim=8,
                         kv_lora_rank=16, v_head_dim=value_width, q_lora_rank=0,
                         attention_scale=24 ** -0.5, implementation=implementation)


@pytest.mark.parametrize("implementation, value_width", [("splash", 12), ("xla", 12),
                                                         ("xla", 40)])
def test_training_kernels_take_the_values_width(implementation, value_width):
  """splash takes the narrower values as they are; XLA's fused attention (one width) gets
  them padded, or wider values with the queries and keys padded; each equals the einsum
  row, forward and gradients."""
  x = jax.random.normal(jax.random.key(1), (1, 128, 32))
  positions = jnp.arange(128)[None]
  reference = _layer("einsum", value_width)
  params = reference.init(jax.random.key(0), x, positions, None)

  def loss(layer, params):
    return jnp.sum(jnp.sin(layer.apply(params, x, positions, None)))

  with jax.default_matmul_precision("highest"):
    expected, expected_grads = jax.value_and_grad(loss, 1)(reference, params)
    layer = _layer(implementation, value_width)
    got, grads = jax.value_and_grad(loss, 1)(layer, params)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
    if implementation == "splash" and jax.default_backend() == "tpu":
      # On a TPU the kernel's own dots run at Mosaic's default float32 precision: splash asks
      # for none, and the global "highest" above does not reach inside a Pallas kernel. Their
      # rounding is relative to the terms of each sum, not to each gradient element, so there
      # the bound is on the largest element's scale (a v5e: 1.6e-5 of it at most, with two
      # of 768 elements past the elementwise bound below on 2026-12-07).
      assert np.abs(np.asarray(a) - b).max() <= 1e-4 * np.abs(b).max()
    else:
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4)


def test_fsdp_splits_every_weight_matrix_of_deepseek_v3():
  """Under the default rules every weight matrix of DeepSeek-V3's full shapes (from
  `parameter_shapes`, nothing allocated) has a dimension on `fsdp`: the up projections,
  which have no `embed`, by their input (`q_lora`, `kv_lora`); whole on every chip they were
  3.3B parameters. Their shards at fsdp=128 (a v5p-256) are the matrices over 128."""
  partitioner = Partitioner()
  matrices = 0
  for p in DeepSeekV3(scan_layers=True).parameter_shapes():
    bare = p.axes[1:] if p.axes[:1] == ("layers",) else p.axes
    if len(bare) < 2:  # Norms and biases: small, whole.
      continue
    matrices += 1
    assert any("fsdp" in axes for axes in partitioner.mesh_axes_of(p.axes)), (p.path, p.axes)
    if "q_lora" in p.axes or "kv_lora" in p.axes:
      split = p.axes.index("q_lora" if "q_lora" in p.axes else "kv_lora")
      assert p.shape[split] % 128 == 0, p  # 1536 and 512 over a v5p-256's 128 chips.
  assert matrices >= 12


def test_lora_targets_every_latent_projection_by_default():
  for name, query in (("v3", ["query_a/kernel", "query_b_kernel"]), ("v2", ["query_kernel"])):
    model = MODELS[name]()
    chosen = lora.check_targets(lora.LoraSettings(), model, 8)
    attention = sorted(p.split("attention/")[1] for p in chosen
                       if p.startswith("layer_0/attention/"))
    assert attention == sorted(query + ["kv_a/kernel", "kv_b_kernel", "out_kernel"])


@pytest.mark.parametrize("field, value, words", [
    ("qk_rope_head_dim", 7, "must be even"),
    ("head_dim", 64, "is derived by latent attention"),
    ("num_kv_heads", 1, "is derived by latent attention"),
    ("layer_kinds", ("sliding",), "attends to the whole context"),
    ("qk_norm", "head", "is not a choice of latent attention's blocks"),
])
def test_bad_latent_settings_are_one_line_naming_the_field(field, value, words):
  model = MODELS["v3"](**{field: value, "window": 8} if field == "layer_kinds"
                       else {field: value})
  with pytest.raises(UsageError, match=words) as refused:
    model.validate(target.host())
  assert str(refused.value).startswith(f"model.{field}=") and "\n" not in str(refused.value)


def test_a_bad_latent_rank_on_the_command_line_exits_2_in_one_line(tmp_path):
  result = run_cli(["--exp=PyCodeDeepSeekV3Tiny", "--mode=compile",
                    f"--job_log_dir={tmp_path / 'job'}", "--fdl.model.kv_lora_rank=0"])
  assert result.code == 2, result.stderr[-2000:]
  assert "model.kv_lora_rank" in result.stderr
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr
