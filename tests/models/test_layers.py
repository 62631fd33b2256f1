"""Layers against plain NumPy references written from the papers' formulas."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite.models import layers, rotary


def numpy_rotary_gptj(x, positions, rotary_dim, base=10000.0):
  """mesh-transformer-jax's formula: sin/cos repeated interleaved, rotate_every_two."""
  inv_freq = 1.0 / (base ** (np.arange(0, rotary_dim, 2) / rotary_dim))
  angles = positions[..., None].astype(np.float64) * inv_freq       # [b, t, r/2]
  sin = np.repeat(np.sin(angles), 2, axis=-1)[:, :, None, :]        # [b, t, 1, r]
  cos = np.repeat(np.cos(angles), 2, axis=-1)[:, :, None, :]
  rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
  rotated_pairs = np.stack([-rot[..., 1::2], rot[..., ::2]], axis=-1).reshape(rot.shape)
  return np.concatenate([rot * cos + rotated_pairs * sin, rest], axis=-1)


def numpy_rotary_half(x, positions, base=10000.0):
  """Llama / GPT-NeoX: feature i pairs with i + d/2 (rotate_half)."""
  dim = x.shape[-1]
  inv_freq = 1.0 / (base ** (np.arange(0, dim, 2) / dim))
  angles = positions[..., None].astype(np.float64) * inv_freq
  angles = np.concatenate([angles, angles], axis=-1)[:, :, None, :]
  rotate_half = np.concatenate([-x[..., dim // 2:], x[..., :dim // 2]], axis=-1)
  return x * np.cos(angles) + rotate_half * np.sin(angles)


@pytest.fixture(name="x")
def fixture_x():
  return np.random.default_rng(0).normal(size=(2, 7, 3, 16)).astype(np.float32)


@pytest.fixture(name="positions")
def fixture_positions():
  return np.stack([np.arange(7), np.array([0, 1, 2, 0, 1, 5, 9])]).astype(np.int32)


def test_rotary_interleaved_matches_gptj_reference(x, positions):
  sin, cos = rotary.sin_cos(jnp.asarray(positions), 8, 10000.0)
  got = rotary.apply(jnp.asarray(x), sin, cos, "interleaved")
  np.testing.assert_allclose(got, numpy_rotary_gptj(x, positions, 8), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[..., 8:], x[..., 8:])  # Unrotated dims pass through.


def test_rotary_half_matches_neox_reference(x, positions):
  sin, cos = rotary.sin_cos(jnp.asarray(positions), 16, 10000.0)
  got = rotary.apply(jnp.asarray(x), sin, cos, "half")
  np.testing.assert_allclose(got, numpy_rotary_half(x, positions), rtol=1e-5, atol=1e-5)


def test_rotary_is_relative(x):
  """q.k after rotation depends only on the distance between positions."""
  sin_a, cos_a = rotary.sin_cos(jnp.array([[3, 5]]), 16, 10000.0)
  sin_b, cos_b = rotary.sin_cos(jnp.array([[10, 12]]), 16, 10000.0)
  q = jnp.asarray(x[:1, :2])
  for style in ("interleaved", "half"):
    qa = rotary.apply(q, sin_a, cos_a, style)
    qb = rotary.apply(q, sin_b, cos_b, style)
    dot_a = jnp.einsum("hd,hd->h", qa[0, 0], qa[0, 1])
    dot_b = jnp.einsum("hd,hd->h", qb[0, 0], qb[0, 1])
    np.testing.assert_allclose(dot_a, dot_b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_norm_matches_numpy(kind):
  x = np.random.default_rng(1).normal(size=(3, 5, 8)).astype(np.float32) * 3 + 1
  norm = layers.Norm(kind=kind, eps=1e-5)
  params = norm.init(jax.random.key(0), x)
  got = norm.apply(params, x)
  if kind == "layernorm":
    expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
  else:
    expected = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_attention_mask_is_causal_and_within_segments():
  mask = layers.attention_mask(jnp.array([[1, 1, 2, 2, 2]]), 5)[0, 0, 0]
  expected = np.array([[1, 0, 0, 0, 0],
                       [1, 1, 0, 0, 0],
                       [0, 0, 1, 0, 0],
                       [0, 0, 1, 1, 0],
                       [0, 0, 1, 1, 1]], bool)
  np.testing.assert_array_equal(mask, expected)


def test_grouped_query_attention_equals_repeated_kv_heads():
  """GQA with kv heads shared by groups == MHA whose k/v kernels repeat those heads."""
  x = jax.random.normal(jax.random.key(0), (2, 6, 32))
  positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
  mask = None  # Causal only.
  gqa = layers.Attention(num_heads=4, num_kv_heads=2, head_dim=8, rotary_dim=8,
                         rotary_style="half")
  params = nn.meta.unbox(gqa.init(jax.random.key(1), x, positions, mask)["params"])
  mha = layers.Attention(num_heads=4, num_kv_heads=4, head_dim=8, rotary_dim=8,
                         rotary_style="half")
  mha_params = dict(params)
  for name in ("key_kernel", "value_kernel"):
    mha_params[name] = jnp.repeat(params[name], 2, axis=1)
  np.testing.assert_allclose(
      gqa.apply({"params": params}, x, positions, mask),
      mha.apply({"params": mha_params}, x, positions, mask), rtol=1e-5, atol=1e-5)


def _plain_attention(params, x, mask, num_kv_heads):
  """Textbook attention in plain JAX: softmax(q k^T / sqrt(d), masked) v, then the output."""
  q = jnp.einsum("btd,dhk->bthk", x, params["query_kernel"])
  k = jnp.repeat(jnp.einsum("btd,dhk->bthk", x, params["key_kernel"]),
                 q.shape[2] // num_kv_heads, axis=2)
  v = jnp.repeat(jnp.einsum("btd,dhk->bthk", x, params["value_kernel"]),
                 q.shape[2] // num_kv_heads, axis=2)
  logits = jnp.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
  probs = jax.nn.softmax(jnp.where(mask[:, :, 0], logits, -1e30), axis=-1)
  return jnp.einsum("bthk,hkd->btd", jnp.einsum("bhts,bshk->bthk", probs, v),
                    params["out_kernel"])


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_attention_and_its_gradient_match_textbook_softmax(num_kv_heads):
  """Output and input/parameter gradients equal softmax attention, with packed segments."""
  x = jax.random.normal(jax.random.key(0), (2, 6, 32))
  positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
  segment_ids = jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 2, 2, 2, 3]])
  mask = layers.attention_mask(segment_ids, 6)
  attention = layers.Attention(num_heads=4, num_kv_heads=num_kv_heads, head_dim=8)
  params = nn.meta.unbox(attention.init(jax.random.key(1), x, positions, segment_ids)["params"])
  ours = lambda p, x: attention.apply({"params": p}, x, positions, segment_ids)
  plain = lambda p, x: _plain_attention(p, x, mask, num_kv_heads)
  np.testing.assert_allclose(ours(params, x), plain(params, x), rtol=1e-5, atol=1e-6)
  cotangent = jax.random.normal(jax.random.key(2), x.shape)
  ours_grads = jax.grad(lambda p, x: jnp.sum(ours(p, x) * cotangent), argnums=(0, 1))(params, x)
  plain_grads = jax.grad(lambda p, x: jnp.sum(plain(p, x) * cotangent), argnums=(0, 1))(params, x)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               ours_grads, plain_grads)


@pytest.mark.parametrize("num_kv_heads", [4, 2])
@pytest.mark.parametrize("segment_ids", [None, [[1, 1, 1, 2, 2, 2], [1, 2, 2, 3, 3, 3]]])
def test_jax_dot_product_attention_implementation_equals_einsum_kernel(num_kv_heads, segment_ids):
  """`implementation="xla"` (jax.nn.dot_product_attention): same function and gradient.

  Without segments the kernel is told "causal" by a flag, not a mask.
  """
  x = jax.random.normal(jax.random.key(0), (2, 6, 32))
  positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
  segment_ids = None if segment_ids is None else jnp.array(segment_ids)
  make = lambda implementation: layers.Attention(
      num_heads=4, num_kv_heads=num_kv_heads, head_dim=8, rotary_dim=8, rotary_style="half",
      implementation=implementation)
  params = nn.meta.unbox(make("einsum").init(jax.random.key(1), x, positions,
                                             segment_ids)["params"])
  cotangent = jax.random.normal(jax.random.key(2), x.shape)
  results = {}
  for implementation in ("einsum", "xla"):
    apply = lambda p, x, i=implementation: make(i).apply({"params": p}, x, positions,
                                                         segment_ids)
    results[implementation] = (apply(params, x), jax.grad(
        lambda p, x: jnp.sum(apply(p, x) * cotangent), argnums=(0, 1))(params, x))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               results["xla"], results["einsum"])


@pytest.mark.parametrize("dtype, rtol", [("bfloat16", 3e-2), ("float16", 3e-3)])
def test_half_precision_attention_over_long_diffuse_context_stays_finite(dtype, rtol):
  """Uniform attention over 4096 keys whose values are all 32: the un-normalized sum
  (4096 x 32) overflows float16, the attention output (32) does not."""
  length, dim = 4096, 16
  attention = layers.Attention(num_heads=1, num_kv_heads=1, head_dim=dim, dtype=dtype)
  x = jnp.ones((1, length, dim), dtype)
  positions = jnp.arange(length)[None]
  params = nn.meta.unbox(attention.init(jax.random.key(0), x, positions, None)["params"])
  params = {**params, "query_kernel": jnp.zeros_like(params["query_kernel"]),  # Uniform.
            "value_kernel": jnp.full_like(params["value_kernel"], 2.0),      # v = 32.
            "out_kernel": jnp.eye(dim).reshape(params["out_kernel"].shape)}
  out = attention.apply({"params": params}, x, positions, None)
  assert out.dtype == jnp.dtype(dtype)
  np.testing.assert_allclose(np.asarray(out, np.float32), 32.0, rtol=rtol)
