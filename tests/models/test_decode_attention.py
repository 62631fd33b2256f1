"""The TPU decode kernel (models/decode_attention.py), run here in Pallas's interpret mode:
the softmax over each slot's filled entries as a float64 NumPy computation gives it, the same
decode step as the written-out path for a full cache and a wrapped sliding-window ring, and
the written-out path where the kernel has no form. (On a TPU, bench/tpu_decode.py times it.)"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite import target as targets
from lingvo_lite.models import decode_attention, layers


def _bfloat16_values(key, shape):
  """Normal values that bfloat16 holds exactly: the kernel multiplies in bfloat16, so a
  comparison at float32 tolerances needs inputs it does not round."""
  return jax.random.normal(key, shape).astype(jnp.bfloat16)


def test_the_kernel_is_the_softmax_over_each_slots_filled_entries():
  """3 slots x 2 key/value heads x a group of 3 query heads over 256 entries (2 pages of
  128), lengths inside a page, at a page edge and the whole slot; float64 reference."""
  slots, kv_heads, group, entries, head_dim = 3, 2, 3, 256, 128
  keys = _bfloat16_values(jax.random.key(0), (slots, kv_heads, entries, head_dim))
  values = _bfloat16_values(jax.random.key(1), (slots, kv_heads, entries, head_dim))
  q = _bfloat16_values(jax.random.key(2), (slots, kv_heads, group, head_dim)).astype(
      jnp.float32) / 16
  lengths = np.array([37, 128, 256], np.int32)
  out = decode_attention.attend(q, keys, values, jnp.asarray(lengths))
  q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, keys, values))
  logits = np.einsum("bkgd,bksd->bkgs", q64, k64)
  logits = np.where(np.arange(entries) < lengths[:, None, None, None], logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  expected = np.einsum("bkgs,bksd->bkgd", weights / weights.sum(-1, keepdims=True), v64)
  assert out.shape == expected.shape and out.dtype == jnp.float32
  # Interpreted, the kernel's products are float32's; compiled for a TPU, the MXU rounds the
  # float32 probabilities to bfloat16 before multiplying them by the values (its default
  # precision: models/decode_attention.py), 2^-8 of each weight.
  tolerance = 1e-2 if jax.default_backend() == "tpu" else 1e-5
  np.testing.assert_allclose(np.asarray(out), expected, rtol=tolerance, atol=tolerance)


def _decode_steps(window, cache_keys, cache_values, positions, implementations, run=True):
  """One decode step of a bfloat16 grouped-query attention layer over the given cache, per
  implementation (the same parameters): {implementation: (output, new keys, new values,
  whether the kernel is in the program)}; without `run`, only traced (no output)."""
  make = lambda implementation: layers.Attention(
      num_heads=6, num_kv_heads=2, head_dim=cache_keys.shape[-1],
      rotary_dim=cache_keys.shape[-1], rotary_style="half",
      dtype=jnp.bfloat16, implementation=implementation, window=window)
  x = _bfloat16_values(jax.random.key(3), (positions.shape[0], 1, 48))
  context = layers.Context(cache_keys, cache_values)
  params = nn.meta.unbox(make("einsum").init(jax.random.key(4), x, positions, None,
                                             context)["params"])
  results = {}
  for implementation in implementations:
    step = lambda p, i=implementation: make(i).apply({"params": p}, x, positions, None,
                                                     context)
    kernel = "pallas_call" in str(jax.make_jaxpr(step)(params))
    out, new_context = jax.jit(step)(params) if run else (None, context)
    results[implementation] = (out, new_context.keys, new_context.values, kernel)
  return results


@pytest.mark.parametrize("window", [None, 64])
def test_a_decode_step_through_the_kernel_equals_the_written_out_step(window):
  """Slots at positions 0, mid-page and (with a window of 64 entries) past a full ring: the
  same output within bfloat16's rounding of the two paths, the same cache written."""
  entries = window or 256
  shape = (3, 2, entries, 128)
  keys = _bfloat16_values(jax.random.key(5), shape)
  values = _bfloat16_values(jax.random.key(6), shape)
  positions = jnp.asarray([[0], [41], [200]], jnp.int32)
  steps = _decode_steps(window, keys, values, positions, ("einsum", "paged"))
  einsum, kernel = steps["einsum"], steps["paged"]
  assert kernel[3] and not einsum[3]
  np.testing.assert_array_equal(kernel[1], einsum[1])
  np.testing.assert_array_equal(kernel[2], einsum[2])
  out_kernel, out_einsum = (np.asarray(r[0], np.float32) for r in (kernel, einsum))
  scale = np.abs(out_einsum).max()
  assert np.abs(out_kernel - out_einsum).max() <= 2e-2 * scale


@pytest.mark.parametrize("dtype, entries, head_dim", [
    (jnp.float32, 64, 128), (jnp.bfloat16, 40, 128), (jnp.bfloat16, 64, 64)])
def test_the_kernel_has_no_form_for_a_float32_cache_odd_entries_or_narrow_heads(
    dtype, entries, head_dim):
  """A float32 cache (the kernel would round it to bfloat16), 40 entries (no page size
  divides them) and heads of 64 (Mosaic takes whole 128-lane blocks only) take the
  written-out path, on a TPU too."""
  assert not decode_attention.supports(1, entries, head_dim, dtype)
  assert not decode_attention.supports(2, 64, 128, jnp.bfloat16)  # A prefill's tokens.
  shape = (2, 2, entries, head_dim)
  keys, values = (jnp.zeros(shape, dtype) for _ in range(2))
  positions = jnp.asarray([[3], [9]], jnp.int32)
  assert not _decode_steps(None, keys, values, positions, ("paged",), run=False)["paged"][3]


@pytest.mark.parametrize("head_dim, kernel", [(128, True), (64, False)])
def test_a_tpu_compile_from_this_host_lowers_the_kernel_where_it_has_a_form(head_dim, kernel):
  """Under a TPU topology's target, a bfloat16 decode step is lowered for Mosaic (the TPU's
  custom call in the program, not its interpretation) for heads of 128, and written out for
  heads of 64."""
  shape = (8, 2, 256, head_dim)
  cache = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  positions = jax.ShapeDtypeStruct((8, 1), jnp.int32)
  attention = layers.Attention(num_heads=6, num_kv_heads=2, head_dim=head_dim,
                               rotary_dim=head_dim, rotary_style="half", dtype=jnp.bfloat16,
                               implementation="paged")
  x = jax.ShapeDtypeStruct((8, 1, 48), jnp.bfloat16)
  step = lambda p, x, k, v, positions: attention.apply(
      {"params": p}, x, positions, None, layers.Context(k, v))
  with targets.active(targets.compile_target("v5e-1")):
    params = jax.eval_shape(lambda x, k, v, positions: attention.init(
        jax.random.key(0), x, positions, None, layers.Context(k, v)), x, cache, cache,
                            positions)["params"]
    lowered = jax.jit(step).trace(nn.meta.unbox(params), x, cache, cache, positions).lower(
        lowering_platforms=("tpu",))
  assert ("tpu_custom_call" in lowered.as_text()) == kernel
