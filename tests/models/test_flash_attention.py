"""The TPU flash-attention path (models/flash_attention.py), run here in Pallas's interpret mode:
the same function and gradients as the written-out attention for every mask kind, the
written-out path for lengths its blocks do not divide, and "auto"'s choice per platform.
(On a TPU, bench/tpu_numerics.py compares the compiled kernel the same way.)"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite import target as targets
from lingvo_lite.models import flash_attention, layers
from lingvo_lite.testing import synthetic_tiny_setup

# (length, query heads, key/value heads, packed segments, window): causal multi-head
# attention, grouped-query with documents packed, and a sliding window across document and
# block edges (384 = 3 x 3 blocks of 128: blocks wholly outside the band are skipped).
CASES = {"causal": (128, 4, 4, False, None), "grouped_query_segments": (128, 8, 2, True, None),
         "window_segments": (384, 8, 2, True, 48)}
# Interpreted here, the kernel's float32 arithmetic is the written-out path's to 1e-5. Compiled
# on a TPU (the suite's model tests run there at the "highest" matmul precision), its float32
# products are the MXU's multi-pass bfloat16 ones and its exp the TPU's, beside XLA's fused
# einsum: up to 4e-4 apart where outputs reach 10 (measured on a v5e). A wrong mask moves
# outputs by tenths.
ATOL = 1e-3 if jax.default_backend() == "tpu" else 1e-5


def _segments(length):
  return jnp.asarray([[1] * (length // 3) + [2] * (length - length // 3),
                      [1] * 30 + [2] * (length - 56) + [3] * 26])


def _attention(implementation, heads, kv_heads, window):
  return layers.Attention(num_heads=heads, num_kv_heads=kv_heads, head_dim=16, rotary_dim=16,
                          rotary_style="half", implementation=implementation, window=window)


@pytest.mark.parametrize("case", sorted(CASES))
def test_splash_equals_the_einsum_attention_and_its_gradients(case):
  length, heads, kv_heads, segmented, window = CASES[case]
  x = jax.random.normal(jax.random.key(0), (2, length, 32))
  positions = jnp.broadcast_to(jnp.arange(length), (2, length))
  segments = _segments(length) if segmented else None
  params = nn.meta.unbox(_attention("einsum", heads, kv_heads, window).init(
      jax.random.key(1), x, positions, segments)["params"])
  cotangent = jax.random.normal(jax.random.key(2), x.shape)
  results = {}
  for implementation in ("einsum", "splash"):
    apply = lambda p, x, i=implementation: _attention(i, heads, kv_heads, window).apply(
        {"params": p}, x, positions, segments)
    loss = lambda p, x, apply=apply: jnp.sum(apply(p, x) * cotangent)
    results[implementation] = (apply(params, x), jax.grad(loss, argnums=(0, 1))(params, x))
    # The kernel really ran: its call is in the program.
    assert ("pallas_call" in str(jax.make_jaxpr(apply)(params, x))) == (
        implementation == "splash")
  np.testing.assert_allclose(results["splash"][0], results["einsum"][0], rtol=1e-5, atol=ATOL)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=ATOL),
               results["splash"][1], results["einsum"][1])


def test_a_length_no_block_divides_is_written_out():
  """A prefill bucket of 96 tokens: the einsum path, the same numbers, no kernel."""
  assert flash_attention.block_size(96) is None and flash_attention.block_size(384) == 128
  assert flash_attention.block_size(2048) == 512
  # Heads of 64 take blocks of 1024 where they divide (faster on a v5e), others 512.
  assert flash_attention.block_size(2048, head_dim=64) == 1024
  assert flash_attention.block_size(2048, head_dim=128) == 512
  assert flash_attention.block_size(1536, head_dim=64) == 512
  x = jax.random.normal(jax.random.key(0), (1, 96, 32))
  positions = jnp.arange(96)[None]
  splash = _attention("splash", 4, 2, None)
  params = nn.meta.unbox(splash.init(jax.random.key(1), x, positions, None)["params"])
  apply = lambda p: splash.apply({"params": p}, x, positions, None)
  assert "pallas_call" not in str(jax.make_jaxpr(apply)(params))
  np.testing.assert_allclose(
      apply(params), _attention("einsum", 4, 2, None).apply({"params": params}, x, positions,
                                                             None), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("platform, device_kind, dtype, head_dim, expected", [
    ("tpu", "TPU v5 lite", "bfloat16", 64, "splash"),
    ("tpu", "TPU v5 lite", "float32", 64, "splash"),
    ("gpu", "NVIDIA H100", "bfloat16", 128, "cudnn"),
    ("gpu", "NVIDIA H100", "float32", 128, "xla"),   # cuDNN takes half precision only.
    ("gpu", "NVIDIA H100", "bfloat16", 256, "xla"),  # Nor heads wider than 128.
    ("cpu", "cpu", "bfloat16", 64, "einsum"),
])
def test_auto_resolves_by_the_target_platform(platform, device_kind, dtype, head_dim, expected):
  assert layers.resolve_implementation("auto", platform, device_kind, dtype,
                                       head_dim) == expected
  assert layers.resolve_implementation("einsum", platform, device_kind, dtype,
                                       head_dim) == "einsum"


def test_a_tpu_compile_from_this_host_traces_the_kernel():
  """Under a TPU topology's target (what --mode=compile sets), "auto" is the kernel and it is
  traced for Mosaic, not interpreted: the program holds the TPU custom call."""
  setup = synthetic_tiny_setup("PyCodeLlamaTiny", "train_data.sequence_length=128",
                               "model.max_length=128")
  assert setup.model.attention_implementation == "auto"
  assert setup.model.resolved_attention_implementation() == (
      "splash" if jax.default_backend() == "tpu" else "einsum")
  target = targets.compile_target("v5e-1")
  with targets.active(target):
    assert setup.model.resolved_attention_implementation() == "splash"
    tokens = jax.ShapeDtypeStruct((2, 128), jnp.int32)
    params = jax.eval_shape(setup.model.init, jax.random.key(0), tokens)
    lowered = jax.jit(setup.model.apply).trace(params, tokens).lower(
        lowering_platforms=("tpu",))
  assert "tpu_custom_call" in lowered.as_text()


def test_heads_of_64_take_the_tuned_kernel_and_equal_a_plain_softmax_attention():
  """1024 positions of 2 query heads over 1 key/value head of 64: blocks of 1024 with keys
  and values sequence-minor (`TUNED_FOR_NARROW_HEADS`), in Pallas's interpret mode. Output
  and gradients against causal softmax attention written in plain JAX."""
  length, head_dim = 1024, 64
  q, k, v = (jax.random.normal(key, (1, length, heads, head_dim)) for key, heads in zip(
      jax.random.split(jax.random.key(7), 3), (2, 1, 1)))
  q = q * head_dim**-0.5  # Scaled, as the layers hand it over.
  # pylint: disable-next=protected-access
  kernel = flash_attention._kernel(length, 2, head_dim, None, True)
  sizes = kernel.kwargs["block_sizes"]
  assert (sizes.block_q, sizes.block_kv_dkv, sizes.k_layout.name, sizes.v_layout.name) == (
      1024, 1024, "SEQ_MINOR", "SEQ_MINOR")

  def plain(q, k, v):
    logits = jnp.einsum("bqhd,bkd->bhqk", q, k[:, :, 0], precision="highest")
    logits = jnp.where(jnp.tril(jnp.ones((length, length), bool)), logits, -jnp.inf)
    return jnp.einsum("bhqk,bkd->bqhd", jax.nn.softmax(logits), v[:, :, 0],
                      precision="highest")

  outputs = {}
  for name, attend in [("kernel", lambda q, k, v: flash_attention.splash_attention(
      q, k, v, None, interpret=True)), ("plain", plain)]:
    loss = lambda q, k, v, attend=attend: (attend(q, k, v) ** 2).sum()
    outputs[name] = (attend(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v))
  np.testing.assert_allclose(outputs["kernel"][0], outputs["plain"][0], rtol=1e-5, atol=ATOL)
  for got, want in zip(outputs["kernel"][1], outputs["plain"][1]):
    # Gradients up to ~44 summed over 1024 positions in float32: a bound relative to their
    # scale (the default blocks of 512 miss the plain sums by the same 4.9e-5 here).
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=ATOL * np.abs(want).max())
