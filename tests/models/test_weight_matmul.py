"""weight_matmul's CPU form against jnp.tensordot and its autodiff gradient (the independent
reference). The CPU form is called directly, so the test means the same on any machine."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite.models import layers
from lingvo_lite.models import weight_matmul as weight_matmul_module

weight_matmul = weight_matmul_module._cpu_weight_matmul  # pylint: disable=protected-access


@pytest.mark.parametrize("x_shape, w_shape, contracting", [
    ((2, 5, 8), (8, 6), 1),          # Dense / MLP.
    ((2, 5, 8), (8, 3, 4), 1),       # q, k, v projections: [d] -> [heads, head_dim].
    ((2, 5, 3, 4), (3, 4, 8), 2),    # Output projection: [heads, head_dim] -> [d].
])
def test_value_and_gradients_equal_tensordot(x_shape, w_shape, contracting):
  x = jax.random.normal(jax.random.key(0), x_shape)
  w = jax.random.normal(jax.random.key(1), w_shape)
  cotangent = jax.random.normal(jax.random.key(2), jnp.tensordot(x, w, contracting).shape)
  ours = lambda x, w: jnp.sum(weight_matmul(x, w, contracting) * cotangent)
  plain = lambda x, w: jnp.sum(jnp.tensordot(x, w, contracting) * cotangent)
  np.testing.assert_allclose(weight_matmul(x, w, contracting), jnp.tensordot(x, w, contracting),
                             rtol=1e-6)
  for got, expected in zip(jax.grad(ours, argnums=(0, 1))(x, w),
                           jax.grad(plain, argnums=(0, 1))(x, w)):
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_gradients_keep_their_dtypes():
  x = jax.random.normal(jax.random.key(0), (4, 8), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (8, 6), jnp.bfloat16)
  x_grad, w_grad = jax.grad(lambda x, w: jnp.sum(weight_matmul(x, w, 1).astype(jnp.float32)),
                            argnums=(0, 1))(x, w)
  assert x_grad.dtype == w_grad.dtype == jnp.bfloat16
  np.testing.assert_allclose(w_grad.astype(np.float32),
                             np.broadcast_to(np.sum(np.asarray(x, np.float32), 0)[:, None],
                                             (8, 6)), rtol=2e-2)


def test_dense_equals_flax_dense_with_the_same_parameters():
  """layers.Dense replaced nn.Dense in the MLP and the output projection: the same parameter
  names, shapes and initial values (a fresh run trains what it trained before), and outputs."""
  x = jax.random.normal(jax.random.key(0), (2, 3, 8))
  plain = nn.Dense(5, kernel_init=layers.dense_init(("embed", "mlp"), 8),
                   bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))
  ours = layers.Dense(5, kernel_axes=("embed", "mlp"))
  expected, got = plain.init(jax.random.key(1), x), ours.init(jax.random.key(1), x)
  assert jax.tree.structure(got) == jax.tree.structure(expected)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(ours.apply(got, x), plain.apply(expected, x), rtol=1e-6)
