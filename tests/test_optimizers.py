"""The optimizer chain: what is decayed, the schedule's shape, clipping."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lingvo_lite.training.optimizers import AdamW, decay_mask


def test_decay_mask_skips_biases_and_norm_scales():
  params = {"dense": {"kernel": jnp.ones((3, 4)), "bias": jnp.ones((4,))},
            "norm": {"scale": jnp.ones((4,))}, "attention": {"query_kernel": jnp.ones((2, 2, 2))}}
  assert decay_mask(params) == {"dense": {"kernel": True, "bias": False},
                                "norm": {"scale": False}, "attention": {"query_kernel": True}}


def test_weight_decay_leaves_vectors_alone():
  """With zero gradients only decoupled weight decay moves parameters: matrices only."""
  optimizer = AdamW(peak_learning_rate=0.1, warmup_steps=0, weight_decay=0.5,
                    clip_grad_norm=None).make(100)
  params = {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,))}
  state = optimizer.init(params)
  updates, _ = optimizer.update(jax.tree.map(jnp.zeros_like, params), state, params)
  new = optax.apply_updates(params, updates)
  np.testing.assert_array_equal(new["bias"], params["bias"])
  assert float(new["kernel"][0, 0]) < 1.0


def test_schedule_warms_up_then_decays_to_the_final_ratio():
  schedule = AdamW(peak_learning_rate=1.0, warmup_steps=10,
                   final_learning_rate_ratio=0.1).schedule(110)
  np.testing.assert_allclose(schedule(0), 0.0)
  np.testing.assert_allclose(schedule(5), 0.5, rtol=1e-6)
  np.testing.assert_allclose(schedule(10), 1.0, rtol=1e-6)
  np.testing.assert_allclose(schedule(60), 0.55, rtol=1e-5)  # Half way down the cosine.
  np.testing.assert_allclose(schedule(110), 0.1, rtol=1e-5)


def test_clipping_bounds_the_global_norm():
  optimizer = AdamW(clip_grad_norm=1.0)
  clipped = optax.clip_by_global_norm(optimizer.clip_grad_norm)
  grads = {"a": jnp.full((4,), 10.0)}
  out, _ = clipped.update(grads, clipped.init(grads))
  np.testing.assert_allclose(optax.tree.norm(out), 1.0, rtol=1e-6)
  chain = optimizer.make(10)
  assert len(chain.init({"a": jnp.ones(2)})) == 2  # clip, then AdamW.
