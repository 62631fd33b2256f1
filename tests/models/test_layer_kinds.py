"""The shared transformer's per-layer attention kinds and the parts today's dense families
added to its blocks, on the Llama family with those fields set (no new family needed):

- a stack of mixed kinds ("sliding" with its own rotary base, "full", "no_rotary"), with
  sandwich or post-norm blocks, (1 + weight) RMSNorm, a query and key RMSNorm per head or over
  the whole projection, an embedding scaled by sqrt(dim) and a query scale of its own, equals
  a plain jax.numpy forward pass written out below from the model's own parameters;
- scanned layers of a repeating pattern (groups plus the layers left over) train and decode
  as unrolled ones; the layouts convert both ways;
- DeepSeek's dense first layers are an unrolled prefix before the scan of the MoE layers
  (one scan, counted in the traced program), which trains as the unrolled stack;
- decoding three windows past the prompt equals teacher forcing through a cache whose
  sliding layers hold only their window, and the cache's bytes are counted layer by layer;
- FLOPs count a sliding layer's attention over its window only (score pairs counted from a
  numpy mask).
The rotary scalings against transformers' own frequencies: tests/weights/
test_hf_dense_families.py (one torch import there).
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec

from lingvo_lite.decode import sampling
from lingvo_lite.decode import steps as decoding
from lingvo_lite.models import layer_layout, transformer_layers
from lingvo_lite.models.deepseek_v3 import DeepSeekV3
from lingvo_lite.models.llama import Llama
from lingvo_lite.models.mixtral import Mixtral
from lingvo_lite.training import steps
from lingvo_lite.training.train_state import TrainState
from tests.models.references import assert_decode_equals_teacher_forcing, rotate_half

WINDOW = 4
SIZES = dict(vocab_size=61, num_layers=5, dim=32, num_heads=4, num_kv_heads=2, head_dim=16,
             mlp_dim=48, max_length=64, window=WINDOW, rotary_base=10000.0,
             sliding_rotary_base=100.0)
# Each case: a block and its norms, a query-key norm, the kinds' pattern (3 does not divide 5
# layers: a scanned stack has a group and two layers left over).
CASES = {
    "sandwich": dict(block="sandwich", norm="rmsnorm_plus_one", qk_norm="head",
                     mlp_activation="geglu", embedding_scale="sqrt_dim",
                     query_pre_attention_scalar=24.0, tie_embeddings=True,
                     layer_kinds=("sliding", "sliding", "full")),
    "post_norm": dict(block="post_norm", qk_norm="projection",
                      layer_kinds=("sliding", "full", "sliding")),
    "no_rotary": dict(layer_kinds=("full", "no_rotary", "sliding")),
}


def _model(case: str, **fields) -> Llama:
  return Llama(**{**SIZES, **CASES[case], **fields})


def _params(model: nn.Module, seed: int = 0):
  """Initialized, then every norm's scale (the (1 + weight) ones start at 0) moved off its
  initial value, so a swapped or missing norm shows."""
  params = nn.meta.unbox(model.init(jax.random.key(seed), jnp.zeros((1, 8), jnp.int32)))
  paths, tree = jax.tree_util.tree_flatten_with_path(params["params"])
  keys = jax.random.split(jax.random.key(seed + 1), len(paths))
  return jax.tree.unflatten(tree, [
      leaf + 0.3 * jax.random.normal(key, leaf.shape) if path[-1].key == "scale" else leaf
      for (path, leaf), key in zip(paths, keys)])


def _tokens(seed: int, shape) -> jax.Array:
  return jax.random.randint(jax.random.key(seed), shape, 0, SIZES["vocab_size"])


# ------------------------------------------------------------------ the reference forward pass


def _norm(x, scale, kind, axes=1, eps=1e-5):
  over = tuple(range(-axes, 0))
  y = x / jnp.sqrt(jnp.mean(x * x, axis=over, keepdims=True) + eps)
  return y * ((1.0 + scale) if kind == "rmsnorm_plus_one" else scale)


def _reference_logits(model: Llama, params, tokens) -> jax.Array:
  """One sequence [t] -> logits [t, vocab], every layer written out with its kind's mask and
  rotary base, the norms where the block kind puts them."""
  length, kind_of = tokens.shape[0], model.layer_kinds
  positions = jnp.arange(length, dtype=jnp.float32)
  i, j = np.arange(length)[:, None], np.arange(length)[None, :]
  norm = lambda x, p, axes=1: _norm(x, p["scale"], model.norm, axes)
  pre = model.block in ("sequential", "sandwich")
  post = model.block in ("sandwich", "post_norm")
  x = params["embedding"][tokens]
  if model.embedding_scale == "sqrt_dim":
    x = x * math.sqrt(model.dim)
  for index in range(model.num_layers):
    kind = kind_of[index % len(kind_of)]
    layer = params[f"layer_{index}"]
    attention = layer["attention"]
    h = norm(x, layer["attention_norm"]) if pre else x
    q = jnp.einsum("td,dhk->thk", h, attention["query_kernel"])
    k = jnp.einsum("td,dhk->thk", h, attention["key_kernel"])
    v = jnp.einsum("td,dhk->thk", h, attention["value_kernel"])
    if model.qk_norm != "none":
      axes = 1 if model.qk_norm == "head" else 2
      q, k = norm(q, attention["query_norm"], axes), norm(k, attention["key_norm"], axes)
    if kind != "no_rotary":
      base = model.sliding_rotary_base if kind == "sliding" else model.rotary_base
      q, k = rotate_half(q, positions, base), rotate_half(k, positions, base)
    group = model.num_heads // model.num_kv_heads
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)  # Head h reads h // g.
    scale = (model.query_pre_attention_scalar ** -0.5 if model.query_pre_attention_scalar
             else 1 / math.sqrt(model.head_dim))
    allowed = (i >= j) & ((i - j < model.window) if kind == "sliding" else True)
    scores = jnp.where(allowed, jnp.einsum("thk,shk->hts", q, k) * scale, -jnp.inf)
    out = jnp.einsum("thk,hkd->td", jnp.einsum("hts,shk->thk", jax.nn.softmax(scores), v),
                     attention["out_kernel"])
    x = x + (norm(out, layer["attention_post_norm"]) if post else out)
    mlp = layer["mlp"]
    h = norm(x, layer["mlp_norm"]) if pre else x
    act = (jax.nn.silu if model.mlp_activation == "swiglu"
           else lambda y: jax.nn.gelu(y, approximate=True))
    hidden = act(h @ mlp["wi"]["kernel"]) * (h @ mlp["wi_gate"]["kernel"])
    out = hidden @ mlp["wo"]["kernel"]
    x = x + (norm(out, layer["mlp_post_norm"]) if post else out)
  x = norm(x, params["final_norm"])
  return x @ (params["embedding"].T if model.tie_embeddings else params["output"]["kernel"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_mixed_kinds_equal_a_plain_jax_numpy_forward_pass(case):
  model = _model(case)
  params = _params(model)
  tokens = _tokens(1, (2, 19))
  logits = jax.jit(model.apply)({"params": params}, tokens)
  with jax.default_matmul_precision("highest"):
    expected = jax.jit(jax.vmap(lambda row: _reference_logits(model, params, row)))(tokens)
  np.testing.assert_allclose(logits, expected, rtol=2e-5, atol=2e-5)
  # The kinds matter: every layer full, the same weights compute other logits past the window.
  full = jax.jit(_model(case, layer_kinds=("full",)).apply)({"params": params}, tokens)
  assert np.abs(full[:, WINDOW:] - logits[:, WINDOW:]).max() > 1e-3


# ------------------------------------------------------------------ scanned equals unrolled


@pytest.mark.parametrize("case", ["post_norm"])
def test_scanned_pattern_groups_train_as_unrolled_layers(case):
  unrolled, scanned = _model(case), _model(case, scan_layers=True)
  assert scanned.scan_plan() == (3, 1)  # One group of the pattern, two layers left over.
  params = _params(unrolled)
  stacked = scanned.to_own_layout(params)
  assert set(stacked) >= {"layers", "layer_3", "layer_4"} and "layer_0" not in stacked
  assert sorted(stacked["layers"]) == ["pattern_0", "pattern_1", "pattern_2"]
  # The scanned tree is what the scanned model initializes, and shapes itself as.
  initialized = nn.meta.unbox(scanned.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))
  assert jax.tree.map(jnp.shape, initialized["params"]) == jax.tree.map(jnp.shape, stacked)
  shapes = {a.path: (a.shape, a.repeats) for a in scanned.parameter_shapes()}
  found = {jax.tree_util.keystr(path): leaf.shape
           for path, leaf in jax.tree_util.tree_flatten_with_path(stacked)[0]}
  assert {path: shape for path, (shape, _) in shapes.items()
          if not path.startswith("['layer_")} == {
              path: shape for path, shape in found.items() if not path.startswith("['layer_")}
  assert sum(np.prod(s) * r for s, r in shapes.values()) == sum(
      np.prod(s) for s in found.values()) == unrolled.num_parameters()
  back = layer_layout.unstack_layers(stacked)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(back),
                                                  jax.tree.leaves(params)))

  tokens = _tokens(2, (2, 13))
  segments = jnp.asarray([[1] * 6 + [2] * 7, [1] * 13])

  def loss(model, tree):
    logits = model.apply({"params": tree}, tokens, segment_ids=segments)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  loss_u, grads_u = jax.jit(jax.value_and_grad(lambda p: loss(unrolled, p)))(params)
  loss_s, grads_s = jax.jit(jax.value_and_grad(lambda p: loss(scanned, p)))(stacked)
  np.testing.assert_allclose(loss_s, loss_u, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(layer_layout.unstack_layers(grads_s)),
                       jax.tree.leaves(grads_u)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ decoding with per-layer caches


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
def test_decoding_three_windows_past_equals_teacher_forcing(scan_layers):
  """Two slots, prompts of 3 (inside the window) and 7 (past it: the prefill wraps the
  sliding layers' rings), then one token at a time to 3 x WINDOW + 5 positions: each step's
  logits are the full forward's at that position; the sliding layers' arrays hold WINDOW
  entries, the full layers' the whole cache length."""
  model = _model("sandwich", scan_layers=scan_layers)
  params = model.to_own_layout(_params(_model("sandwich")))
  total, cache_length = 3 * WINDOW + 5, 64
  sequences = _tokens(4, (2, total))
  cache = model.empty_cache(2, cache_length)
  entries = [(array.kind, array.stacked, keys.shape[-2])
             for array, keys in zip(model.cache_arrays(cache_length), cache.keys)]
  if scan_layers:  # Pattern positions stacked over the one group, then two layers.
    assert entries == [("sliding", True, WINDOW), ("sliding", True, WINDOW),
                       ("full", True, cache_length), ("sliding", False, WINDOW),
                       ("sliding", False, WINDOW)]
  else:
    assert entries == [(kind, False, WINDOW if kind == "sliding" else cache_length)
                       for kind in ("sliding", "sliding", "full", "sliding", "sliding")]
  _, extend = assert_decode_equals_teacher_forcing(model, params, sequences, cache)
  # Every step past the window had the shapes of the first: one compile.
  assert extend._cache_size() == 1  # pylint: disable=protected-access


def _decode_in_layout(model, params, layout, monkeypatch):
  """Two slots' prompts of 3 and 7 (past the window: the prefill wraps the rings), then
  3 x WINDOW greedy and sampled tokens through decode/steps.py with the cache forced into
  `layout`: ((the first cache array's keys' shape, its logical axes), tokens,
  log-probabilities)."""
  monkeypatch.setattr(type(model), "cache_layout", lambda self: layout)
  slots, cache_length, new = 2, 32, 3 * WINDOW
  lengths = np.array([3, 7], np.int32)
  prompts = np.asarray(jnp.where(jnp.arange(8) < lengths[:, None], _tokens(6, (slots, 8)), 0))
  state = decoding.empty_state(model, slots, cache_length)
  state = jax.jit(functools.partial(decoding.prefill, model=model))(
      params, state, prompts, lengths, np.ones(slots, bool), lengths + new,
      sampling.sampling_params(slots, temperature=[0.0, 1.0]),
      np.stack([decoding.key_data(seed) for seed in range(slots)]))
  step = jax.jit(functools.partial(decoding.step, model=model))
  for _ in range(new):
    state, _ = step(params, state)
  return ((state.cache.keys[0].shape, model.cache_logical_specs().keys[0]),
          np.asarray(state.tokens), np.asarray(state.logprobs))


def test_either_cache_layout_decodes_the_same_tokens_and_log_probs(monkeypatch):
  """The cache by head and by position (models/kv_cache.py; forced here, each target picks
  one): the same tokens, greedy and sampled, and the same log-probabilities, through rings
  of sliding layers and a full layer, stacked (a scanned group) and unstacked (the two
  layers left over)."""
  model = _model("sandwich", scan_layers=True)
  params = model.to_own_layout(_params(_model("sandwich")))
  by_head, heads_tokens, heads_logprobs = _decode_in_layout(model, params, "heads",
                                                            monkeypatch)
  by_position, tokens, logprobs = _decode_in_layout(model, params, "positions", monkeypatch)
  # Layer 0's (sliding) keys, stacked over the pattern's one group; sharded alike: slots over
  # the data axes, heads (with their width) over `tensor`.
  kv, width = SIZES["num_kv_heads"], SIZES["head_dim"]
  assert by_head == ((1, 2, kv, WINDOW, width),
                     PartitionSpec("layers", "batch", "heads", "length", "kv"))
  assert by_position == ((1, 2, WINDOW, kv * width),
                         PartitionSpec("layers", "batch", "length", "heads"))
  np.testing.assert_array_equal(tokens, heads_tokens)
  np.testing.assert_allclose(logprobs, heads_logprobs, rtol=1e-5, atol=1e-5)


def test_the_cache_holds_each_layers_own_entries():
  model = _model("sandwich")
  per_position = 2 * 3 * SIZES["num_kv_heads"] * SIZES["head_dim"] * 4  # k and v, 3 slots.
  sliding, full = 4, 1  # Of the 5 layers (pattern: sliding, sliding, full).
  for cache_length in (WINDOW, 64, 100_000):
    expected = per_position * (sliding * WINDOW + full * cache_length)
    assert model.cache_bytes(3, cache_length) == expected
    assert sum(x.nbytes for x in jax.tree.leaves(model.empty_cache(3, cache_length))) == \
        expected
    assert model.clone(scan_layers=True).cache_bytes(3, cache_length) == expected
  # Shorter than the window: only what a request can reach.
  assert model.cache_bytes(3, 2) == per_position * 5 * 2


# ------------------------------------------------------------------ FLOPs


def _pairs(length: int, window: int | None) -> float:
  """Score pairs of a sequence, counted from its mask, in the causal convention (the diagonal
  half-counted: T^2 / 2 for a causal T)."""
  i, j = np.arange(length)[:, None], np.arange(length)[None, :]
  band = (i >= j) & ((i - j < window) if window else True)
  return band.sum() - min(window or length, length) / 2


@pytest.mark.parametrize("length", [4, 9, 64, 700])
def test_flops_count_a_sliding_layer_over_its_window(length):
  model = _model("sandwich")
  heads_width = SIZES["num_heads"] * SIZES["head_dim"]
  pairs = 4 * _pairs(length, WINDOW) + 1 * _pairs(length, None)  # 4 sliding, 1 full.
  assert model.attention_flops_per_token(length) == pytest.approx(
      4 * heads_width * pairs / length, rel=1e-12)
  assert model.train_flops_per_token(length) == pytest.approx(
      6 * model.matmul_parameters() + 3 * 4 * heads_width * pairs / length, rel=1e-12)
  seen = 4 * min(length, WINDOW) + length
  assert model.decode_attention_flops(length) == 4 * heads_width * seen


def test_the_scan_period_from_the_patterns_is_the_listed_layers_shortest_period():
  """`variant_period` (from the two patterns, never listing the layers) equals the shortest
  period of the listed (attention, feed-forward) kinds for every depth up to 3 patterns' worth,
  and a billion layers are counted without listing them; so are the attention kinds used
  (`kinds_used`, read by the checks before the memory verdict)."""
  attention = [("full",), ("sliding", "full"), ("sliding",) * 5 + ("full",),
               ("full", "no_rotary", "sliding", "full")]
  feed_forward = [("moe",), ("dense", "moe"), ("moe", "moe", "dense")]
  for kinds in attention:
    for mlp_kinds in feed_forward:
      for depth in range(1, 3 * len(kinds) * len(mlp_kinds) + 1):
        model = Mixtral(**{**SIZES, "num_layers": depth, "layer_kinds": kinds,
                           "mlp_kinds": mlp_kinds})
        listed = model.layer_variants()
        assert model.variant_period() == transformer_layers.shortest_period(listed), (
            kinds, mlp_kinds, depth)
        assert model.moe_layers() == [m for _, m in listed].count("moe")
        assert model.kinds_used() == {a for a, _ in listed}, (kinds, depth)
  deep = Mixtral(**{**SIZES, "num_layers": 10 ** 9, "layer_kinds": attention[2],
                    "mlp_kinds": feed_forward[2]})
  assert deep.variant_period() == 6
  assert deep.moe_layers() == 2 * 10 ** 9 // 3 + 1  # 10**9 = 3 x 333,333,333 + 1: a "moe".
  assert deep.kinds_used() == {"sliding", "full"}


def test_dense_first_layers_are_a_prefix_only_where_they_break_the_period():
  """With `first_dense_layers`, the prefix is those layers where one of them would be MoE by
  the pattern (else none: they are the pattern's own), and the period is the shortest of the
  listed layers after it; a billion layers are counted without listing them."""
  for kinds in [("full",), ("sliding", "full")]:
    for mlp_kinds in [("moe",), ("dense", "moe"), ("moe", "moe", "dense")]:
      for first in range(5):
        for depth in range(1, 9):
          model = Mixtral(**{**SIZES, "num_layers": depth, "layer_kinds": kinds,
                             "mlp_kinds": mlp_kinds, "first_dense_layers": first})
          listed, prefix = model.layer_variants(), model.scan_prefix()
          pattern = transformer_layers.per_layer(mlp_kinds, min(first, depth))
          breaks = "moe" in pattern and first < depth
          assert prefix == (first if breaks else 0), (kinds, mlp_kinds, first, depth)
          assert [m for _, m in listed[:min(first, depth)]] == ["dense"] * min(first, depth)
          assert model.variant_period() == transformer_layers.shortest_period(
              listed[prefix:]), (kinds, mlp_kinds, first, depth)
  deep = Mixtral(**{**SIZES, "num_layers": 10 ** 9, "layer_kinds": ("sliding", "full"),
                    "mlp_kinds": ("moe",), "first_dense_layers": 3, "scan_layers": True})
  assert deep.scan_prefix() == 3 and deep.scan_plan() == (2, (10 ** 9 - 3) // 2)
  assert deep.scanned_span() == (3, 3 + 2 * ((10 ** 9 - 3) // 2))


# ------------------------------------------------------------------ an unrolled prefix

# DeepSeek-V3's layers at tiny sizes: latent attention, experts in groups, a selection bias.
DEEPSEEK = dict(vocab_size=61, dim=32, num_heads=4, kv_lora_rank=16, q_lora_rank=24,
                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, mlp_dim=40,
                expert_mlp_dim=16, shared_expert_mlp_dim=16, num_experts=4, expert_groups=2,
                expert_groups_per_token=1, experts_per_token=2, max_length=64,
                rotary_scaling="none", selection_bias_rate=0.01, load_balance_coefficient=0.01)
# Each stack: its fields, the layers the scan holds [start, stop), the scan's period.
PREFIXED = {
    # DeepSeek's own: dense layers, then MoE layers (period 1 after the prefix; the whole
    # stack's shortest period is its depth).
    "deepseek": (dict(num_layers=3, first_dense_layers=1), (1, 3), 1),
    # A dense prefix before a pattern (dense, moe) of the rest: a group, a layer left over.
    "prefix_pattern_leftover": (dict(num_layers=4, first_dense_layers=1,
                                     mlp_kinds=("moe", "dense")), (1, 3), 2),
}


def _random_params(model: nn.Module, seed: int = 0):
  """Parameters of `model`'s shapes (traced, not run: a run of the initializers outside a
  compile takes seconds an op), drawn with NumPy: norms' scales about 1, the rest about 0."""
  shapes = jax.eval_shape(lambda: nn.meta.unbox(model.init(
      jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]))
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: (float(path[-1].key == "scale") + 0.1 * rng.standard_normal(
          leaf.shape)).astype(leaf.dtype), shapes)


def _scan_lengths(jaxpr) -> list[int]:
  """The length of every outermost scan in `jaxpr` and the calls inside it (not the loops a
  scan's body runs: the experts' dispatch has its own)."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan":
      found.append(eqn.params["length"])
      continue
    for value in eqn.params.values():
      for inner in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(inner, "jaxpr", inner)
        if hasattr(inner, "eqns"):
          found += _scan_lengths(inner)
  return found


@pytest.mark.parametrize("case", sorted(PREFIXED))
def test_a_dense_prefix_is_unrolled_and_the_layers_after_it_scanned(case):
  """The prefix's layers are `layer_N` of their own, the scan holds the others (one scan of
  `groups` steps in the traced program), the layers left over follow; the layouts convert
  both ways, and the shapes are what the model initializes (the scanned members' kinds are
  the rest's, not the prefix's: a dense member where a MoE one belongs would show)."""
  fields, (start, stop), period = PREFIXED[case]
  unrolled = DeepSeekV3(**DEEPSEEK, **fields)
  scanned = unrolled.clone(scan_layers=True)
  groups = (stop - start) // period
  assert scanned.scanned_span() == (start, stop) and scanned.scan_plan() == (period, groups)
  params = _random_params(unrolled)
  stacked = scanned.to_own_layout(params)
  layer_keys = {f"layer_{i}" for i in [*range(start), *range(stop, fields["num_layers"])]}
  assert {k for k in stacked if k.startswith("layer")} == layer_keys | {"layers"}
  assert {leaf.shape[0] for leaf in jax.tree.leaves(stacked["layers"])} == {groups}
  assert "router_kernel" not in stacked["layer_0"]["mlp"]  # The prefix: dense.
  initialized = jax.eval_shape(lambda: nn.meta.unbox(scanned.init(
      jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]))
  assert jax.tree.map(jnp.shape, initialized) == jax.tree.map(jnp.shape, stacked)
  found = {jax.tree_util.keystr(path): leaf.shape
           for path, leaf in jax.tree_util.tree_flatten_with_path(stacked)[0]}
  shapes = scanned.parameter_shapes()
  assert {a.path: a.shape for a in shapes if a.repeats == 1} == {
      path: shape for path, shape in found.items() if path in {a.path for a in shapes}}
  assert sum(np.prod(a.shape) * a.repeats for a in shapes) == sum(
      np.prod(s) for s in found.values()) == unrolled.num_parameters()
  back = layer_layout.unstack_layers(stacked)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(back),
                                                  jax.tree.leaves(params)))
  jaxpr = jax.make_jaxpr(lambda p: scanned.apply({"params": p}, _tokens(2, (2, 11))))(
      stacked).jaxpr
  assert _scan_lengths(jaxpr) == [groups]


def test_a_dense_prefix_then_scanned_experts_trains_as_the_unrolled_stack():
  """DeepSeek's stack, 2 AdamW steps from the same weights: the scanned layout's losses are
  the unrolled one's, and so is each MoE layer's selection bias after them (moved by its own
  layer's loads: a load counted for another layer would show)."""
  fields = PREFIXED["deepseek"][0]
  unrolled = DeepSeekV3(**DEEPSEEK, **fields)
  scanned = unrolled.clone(scan_layers=True)
  rng = np.random.default_rng(3)
  batches = [{"inputs": jnp.asarray(rng.integers(0, 61, (4, 12))),
              "targets": jnp.asarray(rng.integers(0, 61, (4, 12))),
              "weights": jnp.ones((4, 12), jnp.float32)} for _ in range(2)]
  params = _random_params(unrolled)
  optimizer = optax.adamw(1e-2)

  def run(model, tree):
    state = TrainState(step=jnp.zeros((), jnp.int32), params=tree,
                       opt_state=optimizer.init(tree))
    step = jax.jit(lambda s, b: steps.train_step(s, b, model=model, optimizer=optimizer,
                                                 schedule=lambda _: 1e-2))
    losses = []
    for batch in batches:
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
    return losses, state.params

  losses_u, after_u = run(unrolled, params)
  losses_s, after_s = run(scanned, scanned.to_own_layout(jax.device_get(params)))
  # Losses, not weights: Adam divides by the root of tiny second moments, so float32
  # summation-order noise in near-zero gradients moves single weights visibly.
  np.testing.assert_allclose(losses_s, losses_u, rtol=1e-5)
  biases = lambda tree: {jax.tree_util.keystr(path): np.asarray(leaf)
                         for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
                         if "selection_bias" in jax.tree_util.keystr(path)}
  moved, reference = biases(layer_layout.unstack_layers(jax.device_get(after_s))), biases(
      after_u)
  assert len(reference) == 2 and moved.keys() == reference.keys()
  assert any(np.ptp(value) > 0 for value in reference.values())
  for key, value in reference.items():
    np.testing.assert_allclose(moved[key], value, rtol=0, atol=1e-7, err_msg=key)
