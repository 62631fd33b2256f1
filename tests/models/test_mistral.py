"""The Mistral family: sliding-window attention equals a plain jax.numpy forward pass with a
banded causal mask, decoding far past the window equals teacher forcing through a cache that
holds only the window, its FLOPs count only the window, `tiny` shrinks the window, and
Mistral7B compiles for a v5p-8 with a verdict.

Independent references: a forward pass written out below from the model's own parameters
(embedding, RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, output), the model's
full forward for decoding, and band pairs counted from a numpy mask for the FLOPs.
"""

import json
import math

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.lm.mistral import Mistral7B
from lingvo_lite import mfu, target, testing
from lingvo_lite.config import building
from lingvo_lite.decode import generator as generation
from lingvo_lite.decode.requests import Request
from lingvo_lite.errors import UsageError
from lingvo_lite.models import family
from lingvo_lite.models.llama import Llama
from lingvo_lite.models.mistral import Mistral
from lingvo_lite.training.train_state import strip_boxes
from tests.models.references import assert_decode_equals_teacher_forcing, rotate_half

SIZES = dict(vocab_size=61, num_layers=2, dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
             mlp_dim=48, max_length=64)
WINDOW = 4


def _model(**fields) -> Mistral:
  return Mistral(**{**SIZES, "window": WINDOW, **fields})


def _params(model: nn.Module, seed: int = 0):
  tokens = jnp.zeros((1, 8), jnp.int32)
  return nn.meta.unbox(model.init(jax.random.key(seed), tokens))["params"]


def _tokens(seed: int, shape) -> jax.Array:
  return jax.random.randint(jax.random.key(seed), shape, 0, SIZES["vocab_size"])


# ------------------------------------------------------------------ the reference forward pass


def _rms_norm(x, scale, eps=1e-5):
  return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _reference_logits(params, tokens, window: int) -> jax.Array:
  """One sequence [t] -> logits [t, vocab], written out with its own banded causal mask."""
  length = tokens.shape[0]
  positions = jnp.arange(length, dtype=jnp.float32)
  i, j = np.arange(length)[:, None], np.arange(length)[None, :]
  allowed = (i >= j) & (i - j < window)
  x = params["embedding"][tokens]
  for index in range(SIZES["num_layers"]):
    layer = params[f"layer_{index}"]
    attention = layer["attention"]
    h = _rms_norm(x, layer["attention_norm"]["scale"])
    q = rotate_half(jnp.einsum("td,dhk->thk", h, attention["query_kernel"]), positions)
    k = rotate_half(jnp.einsum("td,dhk->thk", h, attention["key_kernel"]), positions)
    v = jnp.einsum("td,dhk->thk", h, attention["value_kernel"])
    group = SIZES["num_heads"] // SIZES["num_kv_heads"]
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)  # Head h reads h // g.
    scores = jnp.einsum("thk,shk->hts", q, k) / math.sqrt(SIZES["head_dim"])
    scores = jnp.where(allowed, scores, -jnp.inf)
    out = jnp.einsum("hts,shk->thk", jax.nn.softmax(scores, axis=-1), v)
    x = x + jnp.einsum("thk,hkd->td", out, attention["out_kernel"])
    mlp = layer["mlp"]
    h = _rms_norm(x, layer["mlp_norm"]["scale"])
    hidden = jax.nn.silu(h @ mlp["wi"]["kernel"]) * (h @ mlp["wi_gate"]["kernel"])
    x = x + hidden @ mlp["wo"]["kernel"]
  return _rms_norm(x, params["final_norm"]["scale"]) @ params["output"]["kernel"]


@pytest.mark.parametrize("implementation", ["einsum", "xla"])
def test_banded_logits_equal_a_plain_jax_numpy_forward_pass(implementation):
  model = _model(attention_implementation=implementation)
  params = _params(model)
  tokens = _tokens(1, (2, 19))
  logits = jax.jit(model.apply)({"params": params}, tokens)
  expected = jax.jit(jax.vmap(lambda row: _reference_logits(params, row, WINDOW)))(tokens)
  np.testing.assert_allclose(logits, expected, rtol=2e-5, atol=2e-5)
  # The band matters: with a window as long as the sequence, the first WINDOW positions
  # (which see all of theirs either way) agree and every later one differs.
  unbanded = jax.jit(_model(window=19).apply)({"params": params}, tokens)
  np.testing.assert_allclose(unbanded[:, :WINDOW], logits[:, :WINDOW], rtol=2e-5, atol=2e-5)
  assert np.abs(unbanded[:, WINDOW:] - logits[:, WINDOW:]).max(axis=-1).min() > 1e-3
  # ... and that unbanded model is Llama, of the same parameters.
  np.testing.assert_allclose(unbanded, jax.jit(Llama(**SIZES).apply)({"params": params}, tokens),
                             rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("implementation", ["einsum", "xla"])
def test_packed_segments_each_see_their_own_window(implementation):
  model = _model(attention_implementation=implementation)
  params = _params(model)
  first, second = _tokens(2, (9,)), _tokens(3, (11,))
  packed = jnp.concatenate([first, second])[None]
  segments = jnp.asarray([[1] * 9 + [2] * 11])
  logits = jax.jit(model.apply)({"params": params}, packed, segment_ids=segments)[0]
  np.testing.assert_allclose(logits[:9], _reference_logits(params, first, WINDOW),
                             rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(logits[9:], _reference_logits(params, second, WINDOW),
                             rtol=2e-5, atol=2e-5)


# ------------------------------------------------------------------ decoding with the ring


@pytest.mark.parametrize("scan_layers", [False, True])
def test_decoding_three_windows_past_equals_teacher_forcing(scan_layers):
  """Two slots, prompts of 3 (inside the window) and 7 (past it: the prefill wraps the
  ring), then one token at a time to 3 x WINDOW + 5 positions: each step's logits are the
  full forward's at that position."""
  model = _model(scan_layers=scan_layers)
  params = _params(model)
  total = 3 * WINDOW + 5
  sequences = _tokens(4, (2, total))
  # The ring's stale entries stay unseen.
  cache, _ = assert_decode_equals_teacher_forcing(model, params, sequences,
                                                  model.empty_cache(2, 64))
  # Held to the window: every array's entry axis is WINDOW long.
  assert {leaf.shape[-2] for leaf in jax.tree.leaves(cache)} == {WINDOW}


def test_the_cache_holds_the_window_however_long_a_request_decodes():
  model, llama = _model(), Llama(**SIZES)
  per_position = 2 * SIZES["num_layers"] * 3 * SIZES["num_kv_heads"] * SIZES["head_dim"] * 4
  for cache_length in (WINDOW, 64, 100_000):
    assert model.cache_bytes(3, cache_length) == per_position * WINDOW
    assert model.cache_shapes(3, cache_length) == model.cache_shapes(3, WINDOW)
  # Shorter than the window: only what a request can reach.
  assert model.cache_bytes(3, 2) == per_position * 2
  assert llama.cache_bytes(3, 100_000) == per_position * 100_000
  cache = model.empty_cache(3, 100_000)
  assert sum(x.nbytes for x in jax.tree.leaves(cache)) == per_position * WINDOW


def test_greedy_decode_past_the_window_through_the_generator_equals_teacher_forcing():
  """The decode program's generator on `--fiddler=tiny` Mistral7B (scanned layers, window
  16): 50 greedy tokens after a 5-token prompt reach past 3 windows, and each is the argmax
  of the full forward at the position before it."""
  setup = testing.synthetic_tiny_setup(
      "Mistral7B", "decode.cache_length=64", "decode.slots=2", "decode.max_new_tokens=50",
      "decode.steps_per_call=16")
  window = setup.model.window
  params = jax.jit(setup.model.init)(jax.random.key(2), jnp.zeros((1, 8), jnp.int32))
  generator = generation.Generator(setup, strip_boxes(params["params"]))
  prompt = tuple(int(t) for t in np.random.default_rng(0).integers(3, 30000, size=5))
  completion, = generator.generate([Request(source="far", prompt_ids=prompt, temperature=0.0)])
  ids = completion.prompt_ids + completion.completion_ids
  assert len(completion.completion_ids) == 50 and len(ids) > 3 * window
  full = jax.jit(generator.model.apply)({"params": generator.params},
                                    jnp.asarray([ids], jnp.int32))[0]
  assert tuple(int(t) for t in jnp.argmax(full[len(prompt) - 1:-1], axis=-1)) == \
      completion.completion_ids
  assert jax.tree.leaves(generator.state.cache)[0].shape[-2] == window


# ------------------------------------------------------------------ FLOPs, tiny, checks


def _band_pairs(length: int, window: int) -> float:
  """Score pairs a sequence computes, counted from the mask, in Llama's convention (the
  diagonal half-counted: T^2 / 2 for a causal T, so window >= T is Llama's count)."""
  i, j = np.arange(length)[:, None], np.arange(length)[None, :]
  band = (i >= j) & (i - j < window)
  return band.sum() - min(window, length) / 2


@pytest.mark.parametrize("length", [4, 9, 64, 8192])
def test_train_flops_count_only_the_window(length):
  model, llama = _model(), Llama(**SIZES)
  heads_width = SIZES["num_heads"] * SIZES["head_dim"]
  expected = 6 * model.matmul_parameters() + 3 * (
      4 * SIZES["num_layers"] * heads_width * _band_pairs(length, WINDOW) / length)
  assert model.train_flops_per_token(length) == pytest.approx(expected, rel=1e-12)
  assert mfu.model_flops_per_step(model, 2, length) == pytest.approx(
      2 * length * expected, rel=1e-12)
  if length > WINDOW:
    assert model.train_flops_per_token(length) < llama.train_flops_per_token(length)
  else:
    assert model.train_flops_per_token(length) == llama.train_flops_per_token(length)


def test_decode_flops_stay_flat_past_the_window():
  model, llama = _model(), Llama(**SIZES)
  flat = model.decode_flops_per_token(WINDOW)
  assert flat == llama.decode_flops_per_token(WINDOW)
  assert model.decode_flops_per_token(WINDOW - 1) < flat
  for context in (WINDOW + 1, 64, 10**6):
    assert model.decode_flops_per_token(context) == flat < llama.decode_flops_per_token(context)


def test_tiny_shrinks_the_window_below_the_tiny_sequence():
  cfg = testing.tiny_config("Mistral7B")
  assert cfg.model.window == 16 < cfg.train_data.sequence_length == 64
  assert (cfg.model.num_layers, cfg.model.dim, cfg.model.num_kv_heads) == (2, 64, 2)
  model = building.build(cfg).model
  assert isinstance(model, Mistral)
  model.validate(target.host())


def test_mistral7b_has_the_published_shapes():
  cfg = Mistral7B.config()
  model = fdl.build(cfg.model)  # A Flax module is its fields: nothing is allocated.
  assert isinstance(model, Mistral) and family.FAMILIES["mistral"] is Mistral
  assert (model.num_layers, model.dim, model.num_heads, model.num_kv_heads, model.head_dim,
          model.mlp_dim, model.vocab_size, model.window, model.rotary_base) == (
              32, 4096, 32, 8, 128, 14336, 32000, 4096, 10000.0)
  # Hugging Face's Mistral-7B-v0.1 has 7,241,732,096 parameters.
  assert model.num_parameters() == 7_241_732_096
  # Trained past the window, so the band is in the compiled step.
  assert cfg.train_data.sequence_length == 8192 > model.window


def test_a_window_below_one_is_one_line():
  with pytest.raises(UsageError, match=r"^--fdl\.model\.window=0: must be a positive integer$"):
    testing.tiny_config("Mistral7B", "model.window=0")
  with pytest.raises(UsageError, match=r"^model\.window=0: must be at least 1; "):
    _model(window=0).validate(target.host())


@pytest.mark.slow
def test_mistral7b_compiles_for_a_v5p_8_with_a_verdict(tmp_path):
  """As tests/programs/test_compile_experiments.py compiles Llama7B: 8192-token sequences
  (twice the window), sharded, scanned and rematerialized, fit the four 95 GiB chips."""
  try:
    import libtpu  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    pytest.fail(f"libtpu is not installed ({e}); bin/setup.sh installs it")
  job = tmp_path / "job"
  completed = testing.run_cli(["--exp=Mistral7B", "--mode=compile",
                               "--compile_topology=v5p-8", f"--job_log_dir={job}"])
  assert completed.code == 0, completed.stderr[-2000:]
  report = json.loads((job / "compile" / "report.json").read_text())
  assert report["verdict"] == "FITS"
  assert "verdict: FITS:" in completed.stdout
  assert 0 < report["memory"]["deciding"] <= report["memory"]["available"]
  assert report["parameters"] == 7_241_732_096
