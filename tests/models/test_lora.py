"""LoRA adapters at the weight matmul (models/lora.py): where they go on every family, that each
is added once (the adapted model equals its merged weights), a train step's adapter gradients
against jax.grad of a plain jax.numpy Llama whose kernels are W + (alpha/r) A B, QLoRA over int8
weights, and the targets' one-line refusals."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lingvo_lite.errors import UsageError
from lingvo_lite.models import family, lora
from lingvo_lite.models import quantization as quantizing
from lingvo_lite.models.llama import Llama
from lingvo_lite.training import steps
from lingvo_lite.training.train_state import TrainState

family.import_every_family()  # Every family's module registers it in FAMILIES.
SIZES = {"vocab_size": 60, "num_layers": 2, "dim": 32, "num_heads": 4, "max_length": 16}
LENGTH = 12


def _model(name, **fields):
  cls = family.FAMILIES[name]
  # A mixture of experts of 4 (its adapters are the attention's: the experts are no targets).
  experts = ({"num_experts": 4, "experts_per_token": 2}
             if "num_experts" in {f.name for f in dataclasses.fields(cls)} else {})
  return cls(**{**SIZES, **experts, **fields})


def _expert_layers(flat):
  """The feed-forward layers that are mixtures of experts, as path prefixes: those with a
  router (independently of the family's own list of its kinds)."""
  return {path[:-len("router_kernel")] for path in flat if path.endswith("/mlp/router_kernel")}


def _init(model, settings):
  adapted = model.with_adapters(settings)
  variables = nn.meta.unbox(jax.jit(adapted.init)(jax.random.key(0),
                                                  jnp.zeros((1, LENGTH), jnp.int32)))
  return adapted, variables["params"], variables[lora.COLLECTION]


def _shapes(model, settings):
  """(parameters, adapters) as shapes only."""
  variables = nn.meta.unbox(jax.eval_shape(model.with_adapters(settings).init,
                                           jax.random.key(0), jnp.zeros((1, LENGTH), jnp.int32)))
  return variables["params"], variables[lora.COLLECTION]


# Every family unrolled, and one with scanned layers (their adapters stacked like the kernels).
CASES = [(name, False) for name in sorted(family.FAMILIES)] + [("llama", True)]
# The forward passes: Qwen3-MoE's adapters are those of Qwen3's attention (its experts have
# none), which the qwen3 case runs; the other two mixtures have attention of their own.
FORWARD_CASES = [case for case in CASES if case[0] != "qwen3_moe"]


def _random_like(tree, seed, scale=0.3):
  leaves, structure = jax.tree.flatten(tree)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(structure, [scale * jax.random.normal(k, x.shape, x.dtype)
                                        for k, x in zip(keys, leaves)])


def _tokens(seed=0, rows=2):
  return np.random.default_rng(seed).integers(0, SIZES["vocab_size"], (rows, LENGTH))


@pytest.mark.parametrize("name, scan", CASES)
def test_each_targeted_matrix_gets_one_adapter_of_its_shape(name, scan):
  """Every weight matrix of the blocks (and an untied output) can be adapted, but a mixture of
  experts' router and experts; the default targets are the attention projections and the MLP
  matrices; each adapter sits beside its kernel with A [in..., r] and B [r, out...]."""
  model = _model(name, scan_layers=scan)
  params, adapters = _shapes(model, lora.LoraSettings(rank=3, targets=""))
  flat = lora.flatten(params)
  # Independently of models/lora.py: every parameter named kernel is a weight matrix.
  experts = _expert_layers(flat)
  kernels = sorted(path for path in flat if path.endswith("kernel")
                   and not any(path.startswith(layer) for layer in experts))
  assert lora.kernel_paths(adapters) == kernels
  assert lora.adaptable_paths(model, LENGTH) == kernels
  for path, (a, b) in lora.pairs(adapters).items():
    kernel = flat[path].shape
    layer = 1 if path.startswith("layers/") else 0  # A scanned kernel's leading axis.
    contracted = layer + (2 if path.endswith("out_kernel") else 1)
    assert a.shape == (*kernel[:contracted], 3) and b.shape == (*kernel[:layer], 3,
                                                                *kernel[contracted:]), path
  _, default = _shapes(model, lora.LoraSettings(rank=3))
  expected = [p for p in kernels if "/attention/" in p or "/mlp/" in p]
  assert lora.kernel_paths(default) == expected


@pytest.mark.parametrize("name, scan", FORWARD_CASES)
def test_the_adapted_model_computes_its_merged_weights(name, scan):
  """Random adapters on every matrix: the adapted forward pass equals the plain model on
  W + (alpha/r) A B (each update added exactly once) to 1e-5; without the adapters'
  collection the adapted model is its base, and so it is with fresh adapters (B = 0)."""
  model = _model(name, scan_layers=scan)
  settings = lora.LoraSettings(rank=2, alpha=3.0, targets="")
  adapted, params, fresh = _init(model, settings)
  assert not any(np.any(b) for _, b in lora.pairs(fresh).values())
  params = _random_like(params, 1, 0.2)
  adapters = _random_like(fresh, 2)
  tokens = _tokens()
  def forward(params, adapters, fresh):
    return (adapted.apply({"params": params, lora.COLLECTION: adapters}, tokens),
            adapted.apply({"params": params, lora.COLLECTION: fresh}, tokens),
            model.apply({"params": lora.merge(params, adapters, settings.scale)}, tokens),
            model.apply({"params": params}, tokens), adapted.apply({"params": params}, tokens))

  with jax.default_matmul_precision("highest"):
    unmerged, started, merged, base, off = jax.jit(forward)(params, adapters, fresh)
  np.testing.assert_allclose(unmerged, merged, atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(off, base)
  np.testing.assert_allclose(started, base, atol=1e-6)
  assert np.abs(unmerged - base).max() > 1e-2  # The adapters do change the model.


def _rms(x, scale):
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * scale


def _rotate(x, positions, base=10000.0):
  half = x.shape[-1] // 2
  inv = 1.0 / base ** (np.arange(0, 2 * half, 2, dtype=np.float32) / (2 * half))
  angles = positions[:, None] * inv  # [t, half]
  sin, cos = jnp.sin(angles)[None, :, None], jnp.cos(angles)[None, :, None]
  first, second = x[..., :half], x[..., half:]
  return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def _reference_loss(params, adapters, tokens, targets, weights, scale, heads, kv_heads):
  """A Llama written out in jax.numpy: every adapted kernel is W + scale * A B."""
  kernels = lora.flatten(params)
  for path, (a, b) in lora.pairs(adapters).items():
    kernels[path] = kernels[path] + scale * jnp.tensordot(a, b, 1)
  p = lora.unflatten(kernels)
  x = p["embedding"][tokens]
  length = tokens.shape[1]
  positions = np.arange(length, dtype=np.float32)
  causal = np.tril(np.ones((length, length), bool))
  for index in range(SIZES["num_layers"]):
    layer = p[f"layer_{index}"]
    h = _rms(x, layer["attention_norm"]["scale"])
    att = layer["attention"]
    q = _rotate(jnp.einsum("btd,dhk->bthk", h, att["query_kernel"]), positions)
    k = _rotate(jnp.einsum("btd,dhk->bthk", h, att["key_kernel"]), positions)
    v = jnp.einsum("btd,dhk->bthk", h, att["value_kernel"])
    k, v = jnp.repeat(k, heads // kv_heads, axis=2), jnp.repeat(v, heads // kv_heads, axis=2)
    logits = jnp.einsum("bthk,bshk->bhts", q, k) / math.sqrt(q.shape[-1])
    probs = jax.nn.softmax(jnp.where(causal, logits, -1e30), axis=-1)
    out = jnp.einsum("bhts,bshk->bthk", probs, v)
    x = x + jnp.einsum("bthk,hkd->btd", out, att["out_kernel"])
    h = _rms(x, layer["mlp_norm"]["scale"])
    mlp = layer["mlp"]
    hidden = jax.nn.silu(h @ mlp["wi"]["kernel"]) * (h @ mlp["wi_gate"]["kernel"])
    x = x + hidden @ mlp["wo"]["kernel"]
  logits = _rms(x, p["final_norm"]["scale"]) @ p["output"]["kernel"]
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
  return jnp.sum(nll * weights) / jnp.sum(weights)


def test_a_lora_steps_adapter_gradients_equal_a_plain_jax_reference():
  """One train step with SGD at learning rate 1 moves the adapters by minus their gradient:
  it equals jax.grad of the written-out model's loss, and the base does not move."""
  model = Llama(**SIZES, num_kv_heads=2, mlp_dim=48)
  settings = lora.LoraSettings(rank=3, alpha=6.0,
                               targets="attention/(query|value)_kernel|mlp/wo/kernel")
  adapted, params, adapters = _init(model, settings)
  params = _random_like(params, 3, 0.3)
  adapters = _random_like(adapters, 4, 0.2)
  rng = np.random.default_rng(5)
  batch = {"inputs": rng.integers(0, 60, (2, LENGTH)), "targets": rng.integers(0, 60, (2, LENGTH)),
           "weights": (rng.random((2, LENGTH)) > 0.3).astype(np.float32)}
  sgd = optax.sgd(1.0)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=adapters,
                     opt_state=sgd.init(adapters), frozen=params)
  with jax.default_matmul_precision("highest"):
    after, _ = jax.jit(lambda s, b: steps.train_step(
        s, b, model=adapted, optimizer=sgd, schedule=lambda _: 1.0, adapters=True,
        ravel_norm=False))(state, batch)
    expected = jax.jit(jax.grad(_reference_loss, argnums=1), static_argnums=(5, 6, 7))(
        params, adapters, batch["inputs"], batch["targets"], batch["weights"], settings.scale,
        4, 2)
  moved = jax.tree.map(lambda before, now: before - now, adapters, after.params)
  for path, grad in lora.flatten(expected).items():
    np.testing.assert_allclose(lora.flatten(moved)[path], grad, rtol=1e-4, atol=1e-6,
                               err_msg=path)
  assert any(np.abs(g).max() > 1e-3 for g in jax.tree.leaves(expected))
  jax.tree.map(np.testing.assert_array_equal, after.frozen, params)


def test_qlora_adapts_a_base_held_in_int8():
  """Over "int8_weights" the base's matrices are int8 values and scales (QLoRA): the adapted
  model computes as over those weights dequantized, and its adapters get gradients."""
  model = Llama(**SIZES, num_kv_heads=2, quantization="int8_weights")
  settings = lora.LoraSettings(rank=2, targets="")
  adapted, params, adapters = _init(model, settings)
  params = _random_like(params, 6, 0.3)
  adapters = _random_like(adapters, 7, 0.2)
  specs = model.parameter_logical_specs()
  quantized = jax.jit(lambda p: model.decode_params(p, specs))(params)
  assert quantizing.is_quantized(quantized["layer_0"]["attention"]["query_kernel"])
  dequantized = jax.tree.map(lambda leaf: quantizing.dequantize(leaf) if quantizing.is_quantized(
      leaf) else leaf, quantized, is_leaf=quantizing.is_quantized)
  float_model = Llama(**SIZES, num_kv_heads=2).with_adapters(settings)
  tokens = _tokens(8)
  def forward(quantized, dequantized, adapters):
    return (adapted.apply({"params": quantized, lora.COLLECTION: adapters}, tokens),
            float_model.apply({"params": dequantized, lora.COLLECTION: adapters}, tokens),
            jax.grad(lambda a: adapted.apply({"params": quantized, lora.COLLECTION: a},
                                             tokens).sum())(adapters))

  with jax.default_matmul_precision("highest"):
    over_int8, over_float, grads = jax.jit(forward)(quantized, dequantized, adapters)
  np.testing.assert_allclose(over_int8, over_float, atol=1e-4)
  assert all(np.abs(g).max() > 0 for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("targets, message", [
    ("nothing", "train.lora.targets='nothing': matches none of the model's weight matrices; "
                "name some of layer_N/attention/key_kernel"),
    ("norm", "train.lora.targets='norm': matches only parameters LoRA does not adapt "
             "(final_norm/scale, layer_0/attention_norm/scale, layer_0/mlp_norm/scale: it "
             "adapts the blocks' weight matrices"),
    ("(", "train.lora.targets='(': is not a regular expression"),
    # Empty (an unset shell variable) is said as such, with what to write.
    ("", "train.lora.targets='': is empty; give a regular expression of the weight matrices "
         "to adapt, e.g. 'attention/(query|value)_kernel', or leave it out for every "
         "attention projection and MLP matrix"),
    (" ", "train.lora.targets=' ': is empty; give a regular expression"),
    # A mixture of experts' experts and router are no targets (models/lora.py).
    ("mlp/(wi|wo|router)", "train.lora.targets='mlp/(wi|wo|router)': matches only parameters "
                           "LoRA does not adapt (layer_0/mlp/router_kernel, layer_0/mlp/wi, "
                           "layer_0/mlp/wi_gate"),
])
def test_targets_that_adapt_nothing_are_one_line(targets, message):
  model = _model("mixtral") if "router" in targets else Llama(**SIZES)
  with pytest.raises(UsageError) as raised:
    lora.check_targets(lora.LoraSettings(targets=targets), model, LENGTH)
  assert message in str(raised.value) and "\n" not in str(raised.value)
