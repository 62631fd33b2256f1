"""weight_matmul's CPU form against jnp.tensordot and its autodiff gradient (the independent
reference). The CPU form is called directly, so the test means the same on any machine."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite.models import weight_matmul as weight_matmul_module
from lingvo_lite.models.weight_matmul import dense_dot_general

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


def test_dense_hook_matches_plain_dense_and_refuses_other_contractions():
  x = jax.random.normal(jax.random.key(0), (2, 3, 8))
  plain, hooked = nn.Dense(5), nn.Dense(5, dot_general=dense_dot_general)
  params = plain.init(jax.random.key(1), x)
  np.testing.assert_allclose(hooked.apply(params, x), plain.apply(params, x), rtol=1e-6)
  with pytest.raises(ValueError, match="plain contraction"):
    dense_dot_general(x, jnp.ones((3, 5)), (((1,), (0,)), ((), ())))
