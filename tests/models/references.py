"""Written-out references the family tests compare with (tests/models/test_mistral.py,
test_layer_kinds.py): rotate-half rotary positions, and a model's decode steps against its
forward pass over the whole sequence (teacher forcing), for the families whose caches hold
less than the whole context."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def rotate_half(x: jax.Array, positions: jax.Array, base: float = 10000.0) -> jax.Array:
  """x [t, heads, d] rotated at `positions` [t]: feature i pairs with i + d/2."""
  half = x.shape[-1] // 2
  frequencies = base ** (-np.arange(half) * 2.0 / x.shape[-1])
  angle = positions[:, None, None] * frequencies
  a, b = x[..., :half], x[..., half:]
  return jnp.concatenate([a * jnp.cos(angle) - b * jnp.sin(angle),
                          b * jnp.cos(angle) + a * jnp.sin(angle)], axis=-1)


def assert_decode_equals_teacher_forcing(model: Any, params: Any, sequences: jax.Array,
                                         cache: Any) -> tuple[Any, Any]:
  """Two slots (rows of `sequences`), prompts of 3 and 7 tokens prefilled into `cache` (an
  empty cache of two slots, first filled with stale values, as an earlier request leaves it:
  they must stay unseen), then one token at a time to the sequences' end: each step's logits
  are the full forward's at that position.

  Returns:
    (the cache after the last step, the jitted extend step).
  """
  total = sequences.shape[1]
  full = np.asarray(jax.jit(model.apply)({"params": params}, sequences))
  prompt_lengths = jnp.asarray([3, 7], jnp.int32)
  bucket = 8
  prompts = jnp.where(jnp.arange(bucket) < prompt_lengths[:, None], sequences[:, :bucket], 0)
  cache = jax.tree.map(lambda x: x + 5.0, cache)
  logits, cache = jax.jit(model.prefill)(params, prompts, prompt_lengths, cache,
                                         jnp.ones(2, bool))
  np.testing.assert_allclose(logits[:, 0], full[jnp.arange(2), prompt_lengths - 1],
                             rtol=1e-5, atol=1e-5)
  extend = jax.jit(model.extend)
  positions, checked = prompt_lengths, 0
  while int(positions.min()) < total:
    fed = jnp.take_along_axis(sequences, jnp.minimum(positions, total - 1)[:, None], axis=1)
    logits, cache = extend(params, fed, positions[:, None], cache)
    for row in range(2):
      if positions[row] < total:
        np.testing.assert_allclose(logits[row, 0], full[row, positions[row]],
                                   rtol=1e-5, atol=1e-5)
        checked += 1
    positions = positions + 1
  assert checked == 2 * total - 3 - 7
  return cache, extend
