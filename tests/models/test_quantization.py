"""model.quantization's numerics (models/quantization.py), against the float model.

- "int8" training: a step's gradients point where the float step's do (cosine per parameter),
  the step is deterministic, and the compiled step's weight matmuls are int8 dots (counted in
  the optimized HLO), forward and both gradients, while attention's einsums stay float.
- "int8_weights": the model equals the float model run on weights rounded per channel by
  NumPy (the independent reference), whether the weights were quantized once
  (`decode_params`) or as they are multiplied; int8 weights take under a third of the bytes.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite.models import quantization
from lingvo_lite.models.gptj import GptJ
from lingvo_lite.models.llama import Llama
from lingvo_lite.programs.compile.aot import dot_counts
from lingvo_lite.training.train_state import strip_boxes

TOKENS = jax.random.randint(jax.random.key(0), (4, 33), 0, 256)
# Llama: grouped-query attention, a gated MLP, tied embeddings; GPT-J: parallel blocks, biases.
MODELS = {
    "llama": Llama(vocab_size=256, num_layers=2, dim=64, num_heads=4, num_kv_heads=2,
                   tie_embeddings=True),
    "gptj": GptJ(vocab_size=256, num_layers=2, dim=64, num_heads=4, rotary_dim=8),
}


def _loss(params, model):
  logits = model.apply({"params": params}, TOKENS[:, :-1])
  targets = TOKENS[:, 1:, None]
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets, axis=-1))


_gradients = jax.jit(jax.grad(_loss), static_argnums=1)


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_and_params(request):
  model = MODELS[request.param]
  boxed = model.init(jax.random.key(1), TOKENS)["params"]
  return model, strip_boxes(boxed), nn.get_partition_spec(boxed)


def _cosine(a, b):
  a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_int8_gradients_point_where_float_gradients_do(model_and_params):
  model, params, _ = model_and_params
  float_grads = _gradients(params, model)
  int8_model = model.clone(quantization="int8")
  int8_grads = _gradients(params, int8_model)
  cosines = jax.tree.map(_cosine, float_grads, int8_grads)
  worst = min(jax.tree_util.tree_flatten_with_path(cosines)[0], key=lambda pair: pair[1])
  print(f"{type(model).__name__}: lowest gradient cosine {worst[1]:.5f} at "
        f"{jax.tree_util.keystr(worst[0])}")
  assert worst[1] > 0.99, worst
  # Not the float step under another name: the int8 gradients differ.
  assert any(not np.array_equal(a, b) for a, b in
             zip(jax.tree.leaves(float_grads), jax.tree.leaves(int8_grads)))
  # Rounding to nearest: the same step twice gives the same gradients, bit for bit.
  for a, b in zip(jax.tree.leaves(int8_grads),
                  jax.tree.leaves(_gradients(params, model.clone(quantization="int8")))):
    np.testing.assert_array_equal(a, b)


def test_int8_step_multiplies_the_weights_in_int8(model_and_params):
  model, params, _ = model_and_params
  int8_model = model.clone(quantization="int8")
  hlo = _gradients.lower(params, int8_model).compile().as_text()
  counts = dot_counts(hlo)
  # Per block: q, k, v and output projections, the MLP's input (and gate) and output; each
  # in the forward pass and in both gradients.
  weights_per_block = 4 + (3 if int8_model.mlp_activation == "swiglu" else 2)
  assert counts["int8"] == 3 * weights_per_block * model.num_layers, counts
  # Attention's scores and values and the output projection stay float.
  assert counts["float"] >= 3 * 2 * model.num_layers + 3, counts
  assert dot_counts(_gradients.lower(params, model).compile().as_text())["int8"] == 0


def _is_spec(value) -> bool:
  return isinstance(value, jax.sharding.PartitionSpec)


def test_int8_weights_are_the_weights_rounded_per_channel(model_and_params):
  """Each weight matrix's int8 values and scales against NumPy: s = absmax / 127.5 over the
  contracted axes (the absmax on the edge of the top bucket, 127, so every bucket is whole),
  q = clip(round(w / s), -128, 127). Only where w / s is a half-integer to the division's
  last bits may the two round apart, by one: at that edge, and on a TPU, whose float32
  division is not NumPy's to the last bit, anywhere."""
  model, params, specs = model_and_params
  contractions = model.int8_weight_contractions()
  quantized = model.clone(quantization="int8_weights").decode_params(params, specs)
  checked = 0
  for weight, spec, ours in zip(jax.tree.leaves(params), jax.tree.leaves(specs, is_leaf=_is_spec),
                                jax.tree.leaves(quantized, is_leaf=quantization.is_quantized)):
    axes = tuple(spec)
    if axes not in contractions:
      assert not quantization.is_quantized(ours)  # Biases and norms stay as they are.
      continue
    contracted = tuple(i for i, name in enumerate(axes) if name in contractions[axes])
    weight = np.asarray(weight, np.float32)
    scale = np.max(np.abs(weight), axis=contracted, keepdims=True) / np.float32(127.5)
    expected = np.clip(np.round(weight / scale), -128, 127)
    assert ours.qvalue.dtype == jnp.int8 and ours.scale.shape == scale.shape
    np.testing.assert_allclose(ours.scale, scale, rtol=1e-6)
    apart = np.asarray(ours.qvalue, np.float32) != expected
    assert np.all(np.abs(np.asarray(ours.qvalue, np.float32) - expected) <= 1)
    ratio = np.abs(weight / scale)[apart]
    assert np.all(np.abs(ratio - np.floor(ratio) - 0.5) < 1e-4), "apart off a half-integer"
    checked += 1
  # Every block's projections and MLP, the embedding, and an untied output projection.
  per_block = 4 + (3 if model.mlp_activation == "swiglu" else 2)
  assert checked == model.num_layers * per_block + 1 + (0 if model.tie_embeddings else 1)


def test_int8_weights_model_is_the_float_model_on_its_int8_weights(model_and_params):
  """The model under "int8_weights" computes what the float model computes on the int8
  values times their scales (dequantized by NumPy), whether the weights were quantized once
  (`decode_params`, as decoding does) or as they are multiplied."""
  model, params, specs = model_and_params
  int8_model = model.clone(quantization="int8_weights")
  quantized = int8_model.decode_params(params, specs)
  dequantized = jax.tree.map(
      lambda leaf: (np.asarray(leaf.qvalue, np.float32) * np.asarray(leaf.scale, np.float32)
                    if quantization.is_quantized(leaf) else leaf),
      quantized, is_leaf=quantization.is_quantized)
  reference = model.apply({"params": dequantized}, TOKENS)
  once = int8_model.apply({"params": quantized}, TOKENS)
  np.testing.assert_allclose(once, reference, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(int8_model.apply({"params": params}, TOKENS), once)
  float_logits = model.apply({"params": params}, TOKENS)
  assert not np.allclose(once, float_logits, atol=1e-4)  # The rounding shows.


def test_int8_weights_take_under_a_third_of_the_bytes():
  """SmolLM2-135M's shapes (tied embedding), from shapes alone: float32 weights against int8
  values with their float32 scales."""
  model = Llama(vocab_size=49152, num_layers=30, dim=576, num_heads=9, num_kv_heads=3,
                mlp_dim=1536, tie_embeddings=True, quantization="int8_weights")
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
  params, specs = strip_boxes(boxed["params"]), nn.get_partition_spec(boxed["params"])
  quantized = jax.eval_shape(lambda p: model.decode_params(p, specs), params)
  ratio = quantization.weight_bytes(params) / quantization.weight_bytes(quantized)
  print(f"float32 / int8 weight bytes: {ratio:.3f}")
  assert ratio >= 3.5, ratio
  # The specs decoding shards them by have the quantized tree's structure.
  assert jax.tree.structure(model.decode_param_specs(specs), is_leaf=_is_spec) == (
      jax.tree.structure(quantized))
