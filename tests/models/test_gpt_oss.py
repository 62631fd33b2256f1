"""gpt-oss's attention sinks (models/gpt_oss.py) in every attention path: the written-out
softmax against NumPy, the TPU's splash kernel (interpreted here), which takes the sinks
itself, with its gradients (the sinks' too), and the decode cache's path against the whole
sequence's."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lingvo_lite.models import layers
from lingvo_lite.models.gpt_oss import SinkAttention

LENGTH, HEADS, KV_HEADS, HEAD_DIM, WINDOW = 128, 4, 2, 16, 48


def _attention(implementation, window=None):
  return SinkAttention(num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                       rotary_dim=HEAD_DIM, rotary_style="half", use_bias=True,
                       implementation=implementation, window=window)


# On a TPU its exp is a few parts in a million from NumPy's, and the compiled kernel's float32
# products are the MXU's multi-pass ones (tests/models/test_flash_attention.py's ATOL: measured
# on a v5e); interpreted here, float32's own rounding.
TPU = jax.default_backend() == "tpu"
RTOL_EXP = 1e-5 if TPU else 1e-6
ATOL = 1e-3 if TPU else 1e-5


def _setup(window=None):
  x = jax.random.normal(jax.random.key(0), (2, LENGTH, 32))
  positions = jnp.broadcast_to(jnp.arange(LENGTH), (2, LENGTH))
  params = nn.meta.unbox(_attention("einsum", window).init(jax.random.key(1), x, positions,
                                                           None)["params"])
  # Sinks of both signs, large enough to take a visible share of the weight.
  params["sinks"] = jnp.asarray([2.0, -1.0, 0.5, 3.0])
  return x, positions, params


def test_the_sink_takes_its_share_of_every_softmax():
  """softmax over [scores, sink] without the sink's column, against NumPy."""
  logits = np.random.default_rng(0).normal(size=(1, 2, 3, 5)).astype(np.float32)
  mask = np.tril(np.ones((3, 5), bool), 2)[None, None]
  sinks = np.asarray([1.5, -0.5], np.float32)
  weights, denominator = layers.unnormalized_softmax(jnp.asarray(logits), jnp.asarray(mask),
                                                     jnp.asarray(sinks)[None, :, None])
  got = np.asarray(weights / denominator[..., None])
  masked = np.where(mask, logits, -np.inf)
  full = np.concatenate([masked, np.broadcast_to(sinks[None, :, None, None], (1, 2, 3, 1))], -1)
  expected = np.exp(full - full.max(-1, keepdims=True))
  expected = (expected / expected.sum(-1, keepdims=True))[..., :-1]
  np.testing.assert_allclose(got, expected, rtol=RTOL_EXP, atol=1e-7)
  assert np.all(got.sum(-1) < 1)


def test_splash_takes_the_sinks_and_equals_the_einsum_path_and_its_gradients():
  for window in (WINDOW,):  # A band across block edges (the causal mask: its own test).
    x, positions, params = _setup(window)
    cotangent = jax.random.normal(jax.random.key(2), x.shape)
    results = {}
    for implementation in ("einsum", "splash"):
      apply = lambda p, x, i=implementation: _attention(i, window).apply(
          {"params": p}, x, positions, None)
      loss = lambda p, x, apply=apply: jnp.sum(apply(p, x) * cotangent)
      results[implementation] = (apply(params, x), jax.grad(loss)(params, x))
      assert ("pallas_call" in str(jax.make_jaxpr(apply)(params, x))) == (
          implementation == "splash")
    np.testing.assert_allclose(results["splash"][0], results["einsum"][0], rtol=1e-5,
                               atol=ATOL)
    assert np.abs(results["einsum"][1]["sinks"]).max() > 1e-3  # The sinks learn.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=ATOL),
                 results["splash"][1], results["einsum"][1])
    # Without the sinks' parameter the output changes: they are in the computation.
    plain = layers.Attention(num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                             rotary_dim=HEAD_DIM, rotary_style="half", use_bias=True,
                             window=window)
    without = plain.apply({"params": {k: v for k, v in params.items() if k != "sinks"}}, x,
                          positions, None)
    assert np.abs(without - results["einsum"][0]).max() > 1e-2


def test_decoding_through_the_cache_sees_the_sinks_as_the_whole_sequence_does():
  x, positions, params = _setup(WINDOW)
  length = 64
  whole = _attention("einsum", WINDOW).apply({"params": params}, x[:, :length],
                                             positions[:, :length], None)
  attention = _attention("einsum", WINDOW)
  cache = layers.Context(jnp.zeros((2, KV_HEADS, WINDOW, HEAD_DIM)),
                         jnp.zeros((2, KV_HEADS, WINDOW, HEAD_DIM)))
  step = jax.jit(lambda cache, x, p: attention.apply({"params": params}, x, p, None, cache))
  outs = []
  for position in range(length):
    out, cache = step(cache, x[:, position:position + 1], positions[:, position:position + 1])
    outs.append(out)
  np.testing.assert_allclose(np.concatenate(outs, 1), whole, rtol=1e-5, atol=1e-5)
