"""Whole-model properties: causality, segment isolation, parameter counts, logical axes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.lm import architectures
import fiddle as fdl
from lingvo_lite.models import embedding_lookup
from lingvo_lite.models.transformer import TransformerLM, positions_from_segments

FAMILIES = {
    "gptj": architectures.gptj(vocab_size=50, num_layers=2, dim=32, num_heads=4, rotary_dim=4),
    "llama": architectures.llama(vocab_size=50, num_layers=2, dim=32, num_heads=4,
                                 num_kv_heads=2),
    "gpt2": architectures.gpt2(vocab_size=50, num_layers=2, dim=32, num_heads=4,
                               max_length=16),
}


def _model_and_params(family):
  model = fdl.build(FAMILIES[family])
  tokens = jax.random.randint(jax.random.key(0), (2, 12), 1, 50)
  params = model.init(jax.random.key(1), tokens)["params"]
  return model, nn.meta.unbox(params), tokens


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_changing_a_future_token_leaves_earlier_logits_unchanged(family):
  model, params, tokens = _model_and_params(family)
  changed = tokens.at[:, 7].set((tokens[:, 7] + 1) % 50)
  apply = jax.jit(model.apply)
  before = apply({"params": params}, tokens)
  after = apply({"params": params}, changed)
  np.testing.assert_array_equal(before[:, :7], after[:, :7])
  assert not np.allclose(before[:, 7:], after[:, 7:])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_segments_do_not_see_each_other(family):
  """Two documents packed in one row give the logits each gets alone."""
  model, params, tokens = _model_and_params(family)
  first, second = tokens[0, :5], tokens[1, :7]
  packed = jnp.concatenate([first, second])[None]
  segment_ids = jnp.array([[1] * 5 + [2] * 7])
  apply = jax.jit(model.apply)  # One compile per shape, not one per operation and shape.
  logits = apply({"params": params}, packed, segment_ids)
  alone_first = apply({"params": params}, first[None])
  alone_second = apply({"params": params}, second[None])
  np.testing.assert_allclose(logits[0, :5], alone_first[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits[0, 5:], alone_second[0], rtol=1e-5, atol=1e-5)


def test_positions_restart_in_each_segment():
  np.testing.assert_array_equal(
      positions_from_segments(jnp.array([[1, 1, 1, 2, 2, 3, 3, 3, 3]])),
      [[0, 1, 2, 0, 1, 0, 1, 2, 3]])


def _parameter_count(model_config):
  model = fdl.build(model_config)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.meta.unbox(shapes)))


def test_gptj_6b_has_the_hugging_face_parameter_count():
  config = architectures.gptj(vocab_size=50400, num_layers=28, dim=4096, num_heads=16,
                              head_dim=256, rotary_dim=64, mlp_dim=16384)
  # Hugging Face's GPT-J-6B has 6,050,882,784 parameters; its converter folds
  # mesh-transformer-jax's embedding bias (4096 values) into the embedding rows.
  assert _parameter_count(config) == 6_050_882_784 + 4096
  config.embedding_bias = False
  assert _parameter_count(config) == 6_050_882_784


def test_gpt2_small_has_124m_parameters():
  config = architectures.gpt2(vocab_size=50257, num_layers=12, dim=768, num_heads=12,
                              max_length=1024)
  assert _parameter_count(config) == 124_439_808  # Hugging Face's GPT-2 count.


def test_parameters_carry_logical_axes():
  model = fdl.build(FAMILIES["llama"])
  boxed = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  specs = nn.get_partition_spec(boxed)["params"]
  assert tuple(specs["embedding"]) == ("vocab", "embed")
  assert tuple(specs["layer_0"]["attention"]["query_kernel"]) == ("embed", "heads", "kv")
  assert tuple(specs["layer_0"]["mlp"]["wi"]["kernel"]) == ("embed", "mlp")
  assert tuple(specs["layer_0"]["mlp"]["wo"]["kernel"]) == ("mlp", "embed")


def test_bfloat16_activations_with_float32_parameters():
  config = FAMILIES["gptj"]
  model = fdl.build(config).clone(dtype="bfloat16", param_dtype="float32")
  tokens = jnp.ones((1, 8), jnp.int32)
  variables = model.init(jax.random.key(0), tokens)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nn.meta.unbox(variables)))
  logits = model.apply(variables, tokens)
  assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_tied_output_is_the_final_norms_output_times_the_embedding_as_the_reference(family):
  """GPT-2's and Llama's tied head computes final_norm(h) @ E^T, unscaled (what their
  pretrained weights expect); "rsqrt_dim" (the bench shapes') divides h by sqrt(dim)."""
  cfg = FAMILIES[family]
  cfg = fdl.copy_with(cfg, tie_embeddings=True)
  model, params, tokens = _model_and_params_of(cfg)
  assert model.tied_output_scale == "one"
  logits, state = model.apply({"params": params}, tokens, capture_intermediates=True)
  normed = np.asarray(state["intermediates"]["final_norm"]["__call__"][0])
  embedding = np.asarray(params["embedding"])
  np.testing.assert_allclose(np.asarray(logits), normed @ embedding.T, rtol=1e-5, atol=1e-5)
  scaled = fdl.build(fdl.copy_with(cfg, tied_output_scale="rsqrt_dim"))
  np.testing.assert_allclose(np.asarray(scaled.apply({"params": params}, tokens)),
                             normed @ embedding.T / np.sqrt(model.dim), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_embedding_is_initialized_with_the_references_stddev_unless_told(family):
  for stddev, expected in ((None, 0.02), (1.0, 1.0)):
    cfg = fdl.copy_with(FAMILIES[family], vocab_size=512, dim=64)
    if stddev is not None:
      cfg.embedding_init_stddev = stddev
    _, params, _ = _model_and_params_of(cfg)
    assert np.std(np.asarray(params["embedding"])) == pytest.approx(expected, rel=0.05)


def _model_and_params_of(cfg):
  model = fdl.build(cfg)
  tokens = jax.random.randint(jax.random.key(0), (2, 12), 1, cfg.vocab_size)
  params = model.init(jax.random.key(1), tokens)["params"]
  return model, nn.meta.unbox(params), tokens


def test_the_embedding_lookup_is_the_rounded_rows_and_its_gradient_a_float32_sum():
  """models/embedding_lookup.py on one device: the rows equal the float32 table's rows rounded
  to the compute dtype (the table is cast before its whole-table gather), and the gradient
  equals NumPy's float32 scatter-add of the rows' cotangents (a bfloat16 sum of a repeated
  token's ~24 rows, what autodiff of the cast table gives, is off by ~0.1 here). Under a mesh
  the per-shard backward is tests/test_partitioning.py's (every gradient as one device's)."""
  rng = np.random.default_rng(0)
  table = jnp.asarray(rng.normal(size=(50, 16)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, 5, size=(3, 40)), jnp.int32)
  cotangent = jnp.asarray(rng.normal(size=(3, 40, 16)), jnp.bfloat16)
  rows, pullback = jax.vjp(lambda t: embedding_lookup.rows(t, tokens, jnp.bfloat16), table)
  assert rows.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(rows, np.float32), np.asarray(
      np.asarray(table)[np.asarray(tokens)].astype(jnp.bfloat16), np.float32))
  expected = np.zeros((50, 16), np.float32)
  np.add.at(expected, np.asarray(tokens).reshape(-1),
            np.asarray(cotangent, np.float32).reshape(-1, 16))
  np.testing.assert_allclose(pullback(cotangent)[0], expected, rtol=1e-6, atol=1e-6)
