"""The mixture-of-experts layer (models/moe.py) against plain NumPy: the dropless and capacity
dispatches equal every expert run on every token and masked by the routing; a capacity that
drops nothing equals dropless; one that drops follows the priority rule and counts what it
dropped; the load-balancing loss and the router z-loss are their formulas; and the MoE
transformer adds their weighted sum to the training objective and logs them."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.experimental.compilation_cache import compilation_cache as jax_compilation_cache

from lingvo_lite import target
from lingvo_lite.models import expert_dispatch, grouped_matmul, moe
from lingvo_lite.models.moe_transformer import MoeTransformerLM
from lingvo_lite.training import steps
from lingvo_lite.training.train_state import TrainState

TOLERANCE = 1e-5
DIM, HIDDEN, EXPERTS = 16, 24, 6
# (router score, renormalize, k, expert biases and gpt-oss's clamped SwiGLU)
SETTINGS = {"softmax top-2 renormalized": ("softmax", True, 2, False),
            "softmax top-3 as it is": ("softmax", False, 3, False),
            "sigmoid top-2": ("sigmoid", True, 2, False),
            "gpt-oss: biases, clamped": ("softmax", True, 2, True)}


def _layer(setting, dispatch="dropless", factor=1.25):
  score, renormalize, k, oss = SETTINGS[setting]
  return moe.MoeMlp(num_experts=EXPERTS, experts_per_token=k, mlp_dim=HIDDEN,
                    dispatch=dispatch, capacity_factor=factor, router_score=score,
                    renormalize=renormalize, router_bias=oss, expert_bias=oss,
                    activation="clamped_swiglu" if oss else "swiglu", swiglu_limit=1.5)


def _inputs(shape=(3, 10)):
  return jnp.asarray(np.random.default_rng(0).normal(size=(*shape, DIM)), jnp.float32)


def _params(layer, x):
  # Only the shapes are used: traced, not run op by op (each op a compile).
  params = nn.meta.unbox(jax.eval_shape(layer.init, jax.random.key(1), x)["params"])
  generator = np.random.default_rng(2)
  # Biases off zero (a swapped or missing one shows), weights O(1).
  return jax.tree.map(lambda p: jnp.asarray(generator.normal(size=p.shape) * (
      0.3 if p.ndim < 3 and p.shape[0] == EXPERTS else 1.0 / math.sqrt(p.shape[-2]
                                                                       if p.ndim > 1 else 1)),
      jnp.float32), params)


def _apply(layer, params, x):
  with jax.default_matmul_precision("highest"):
    return np.asarray(jax.jit(layer.apply)({"params": params}, x))


def _routing_numpy(params, x, setting):
  """(weights [T, k], experts [T, k], scores [T, E], logits [T, E]) as the module doc says."""
  score, renormalize, k, oss = SETTINGS[setting]
  tokens = np.asarray(x, np.float64).reshape(-1, DIM)
  logits = tokens @ np.asarray(params["router_kernel"], np.float64)
  if oss:
    logits = logits + np.asarray(params["router_bias"], np.float64)
  if score == "softmax":
    scores = np.exp(logits - logits.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
  else:
    scores = 1 / (1 + np.exp(-logits))
  experts = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
  weights = np.take_along_axis(scores, experts, -1)
  if renormalize:
    weights = weights / weights.sum(-1, keepdims=True)
  return weights, experts, scores, logits


def _expert_numpy(params, tokens, expert, setting):
  """One expert on rows `tokens` [N, D], in float64."""
  oss = SETTINGS[setting][3]
  p = {name: np.asarray(value, np.float64) for name, value in params.items()}
  gate, up = tokens @ p["wi"][expert], tokens @ p["wi_gate"][expert]
  if oss:
    gate, up = gate + p["wi_bias"][expert], up + p["wi_gate_bias"][expert]
    gate, up = np.minimum(gate, 1.5), np.clip(up, -1.5, 1.5)
    hidden = (up + 1) * gate / (1 + np.exp(-1.702 * gate))
  else:
    hidden = gate / (1 + np.exp(-gate)) * up
  out = hidden @ p["wo"][expert]
  return out + p["wo_bias"][expert] if oss else out


def _dense_reference(params, x, setting, kept=None):
  """Every expert on every token, summed with the routing weights where the token chose the
  expert (and, given `kept` [T, k], the assignment was kept)."""
  weights, experts, _, _ = _routing_numpy(params, x, setting)
  tokens = np.asarray(x, np.float64).reshape(-1, DIM)
  every = np.stack([_expert_numpy(params, tokens, e, setting) for e in range(EXPERTS)], 1)
  mask = np.zeros((len(tokens), EXPERTS))
  for choice in range(experts.shape[1]):
    use = weights[:, choice] * (1 if kept is None else kept[:, choice])
    mask[np.arange(len(tokens)), experts[:, choice]] += use
  return np.einsum("te,ted->td", mask, every).reshape(x.shape)


# Every setting dropless; the dense dispatch (a benchmark's baseline) once.
@pytest.mark.parametrize("setting, dispatch", [
    *((setting, "dropless") for setting in sorted(SETTINGS)),
    ("gpt-oss: biases, clamped", "dense")])
def test_dropless_equals_every_expert_on_every_token_masked_by_the_routing(setting, dispatch):
  layer, x = _layer(setting, dispatch), _inputs()
  params = _params(layer, x)
  expected = _dense_reference(params, x, setting)
  assert np.std(expected) > 0.3
  error = np.abs(_apply(layer, params, x) - expected).max()
  assert error < TOLERANCE, f"{dispatch}: {error:.2e}"


@pytest.mark.parametrize("setting", ["softmax top-2 renormalized", "gpt-oss: biases, clamped"])
def test_the_grouped_matmul_as_accelerators_run_it_equals_the_reference(setting, monkeypatch):
  """Off a CPU the experts are `jax.lax.ragged_dot` (which XLA:CPU runs too, as a dense matmul
  per expert): the same outputs as the reference; and in bfloat16 every grouped product
  without a bias to add comes out in bfloat16 (a float32 output cast afterwards was a float32
  buffer of all k rows a token gets: DeepSeek-V3's 7 GiB ones)."""
  monkeypatch.setattr(expert_dispatch, "current_platform", lambda: "tpu")
  layer, x = _layer(setting), _inputs()
  params = _params(layer, x)
  error = np.abs(_apply(layer, params, x) - _dense_reference(params, x, setting)).max()
  assert error < TOLERANCE, f"{error:.2e}"
  rows, oss = 12, SETTINGS[setting][3]
  weights = expert_dispatch.ExpertWeights(
      *(jnp.zeros(shape, jnp.bfloat16) for shape in ((EXPERTS, DIM, HIDDEN),) * 2
        + ((EXPERTS, HIDDEN, DIM),)),
      *((jnp.zeros((EXPERTS, HIDDEN), jnp.bfloat16),) * 2 if oss else (None, None)), None)
  jaxpr = jax.make_jaxpr(lambda x, sizes, of_rows: expert_dispatch.run_grouped(
      x, sizes, of_rows, weights, "clamped_swiglu" if oss else "swiglu", 1.702, 1.5))(
          jnp.zeros((rows, DIM), jnp.bfloat16), jnp.full((EXPERTS,), 2, jnp.int32),
          jnp.zeros((rows,), jnp.int32))
  products = [e.outvars[0].aval.dtype for e in _ragged_products(jaxpr.jaxpr)]
  assert products == ([jnp.float32] * 2 + [jnp.bfloat16] if oss else [jnp.bfloat16] * 3)
  assert jaxpr.out_avals[0].dtype == jnp.bfloat16


def _ragged_products(jaxpr):
  """The `ragged_dot_general` equations of `jaxpr` and of every jaxpr inside it, in order."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name.startswith("ragged_dot"):
      found.append(eqn)
    for value in eqn.params.values():
      for inner in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(inner, "jaxpr", inner)  # A closed jaxpr's own.
        if hasattr(inner, "eqns"):
          found.extend(_ragged_products(inner))
  return found


# Stages x rows x (in, out) width, groups; each stage's sizes: a group past the rows (cut
# there, as ragged_dot cuts it), some rows past the groups, the groups filling the rows.
STAGES, ROWS, WIDTHS, GROUPS = 3, 9, (5, 7), 4
SIZES = ((4, 0, 4, 4), (2, 3, 0, 1), (0, 9, 0, 0))


def _grouped_numpy(lhs, rhs, sizes, cotangent):
  """One stage's grouped matmul lhs [N, K] x rhs [G, K, F] and the gradients of
  sum(out x cotangent), in float64: each row times its group's matrix, zero past the groups."""
  ends = np.minimum(np.cumsum(sizes), len(lhs))
  member = np.zeros((len(lhs), len(sizes)))
  for group, (start, end) in enumerate(zip(np.concatenate([[0], ends[:-1]]), ends)):
    member[start:end, group] = 1
  lhs, rhs, cotangent = (np.asarray(a, np.float64) for a in (lhs, rhs, cotangent))
  return (np.einsum("ng,nk,gkf->nf", member, lhs, rhs),
          np.einsum("ng,nf,gkf->nk", member, cotangent, rhs),
          np.einsum("ng,nk,nf->gkf", member, lhs, cotangent))


# How the grouped matmul is vmapped over the stages: (its in_axes, whether the weights are one
# set for every stage, a vmap of one around it: the fold's own products folded again).
VMAPS = {"weights per stage": ((0, 0, 0), False, False),
         "weights shared": ((0, None, 0), True, False),
         "nested in a vmap of one": ((0, 0, 0), False, True)}


def test_the_vmapped_grouped_matmul_equals_a_loop_over_stages_values_and_gradients():
  """The pipeline's stage axis vmaps the grouped matmul: its fold of the stages into the
  groups gives each stage's products and gradients (NumPy's, one stage at a time)."""
  generator = np.random.default_rng(3)
  lhs, cotangent = (jnp.asarray(generator.normal(size=(STAGES, ROWS, w)), jnp.float32)
                    for w in WIDTHS)
  rhs = jnp.asarray(generator.normal(size=(STAGES, GROUPS, *WIDTHS)), jnp.float32)
  sizes = jnp.asarray(SIZES, jnp.int32)
  for name, (in_axes, shared, nested) in VMAPS.items():
    weights = rhs[0] if shared else rhs
    matmul = jax.vmap(grouped_matmul.ragged_dot, in_axes=in_axes)
    if nested:
      matmul = lambda *a, inner=matmul: jax.vmap(inner)(*(x[None] for x in a))[0]

    def loss(lhs, weights, matmul=matmul):
      out = matmul(lhs, weights, sizes)
      return jnp.sum(out * cotangent), out
    with jax.default_matmul_precision("highest"):
      (_, out), (d_lhs, d_rhs) = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(
          lhs, weights)
    expected = [_grouped_numpy(lhs[s], weights if shared else weights[s], SIZES[s],
                               cotangent[s]) for s in range(STAGES)]
    assert np.std(out) > 0.5 and not np.any(out[1, 6:]), "rows past the groups give zeros"
    for got, want in ((out, [e[0] for e in expected]), (d_lhs, [e[1] for e in expected]),
                      (d_rhs, sum(e[2] for e in expected) if shared
                       else [e[2] for e in expected])):
      error = np.abs(np.asarray(got, np.float64) - np.asarray(want)).max()
      assert error < TOLERANCE, f"{name}: {error:.2e}"


def test_no_product_of_the_vmapped_grouped_matmul_is_batched_and_xla_tpu_compiles_it():
  """Forward and backward, every ragged product of the vmapped grouped matmul has a 2-D lhs
  and no batch dimension, the only form XLA:TPU takes: the v5e compile of the gradient
  succeeds, where `jax.lax.ragged_dot` vmapped is refused (the pipelined experts' failure)."""
  def gradient(matmul):
    def loss(lhs, rhs, sizes):
      return jnp.sum(jax.vmap(matmul)(lhs, rhs, sizes).astype(jnp.float32))
    return jax.jit(jax.grad(loss, (0, 1)))
  shapes = ((STAGES, ROWS, WIDTHS[0]), (STAGES, GROUPS, *WIDTHS), (STAGES, GROUPS))
  arguments = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in
               zip(shapes, (jnp.bfloat16, jnp.bfloat16, jnp.int32))]
  ours = gradient(lambda *a: grouped_matmul.ragged_dot(*a, jnp.float32))
  products = _ragged_products(jax.make_jaxpr(ours)(*arguments).jaxpr)
  assert len(products) == 3  # The forward's, the rows' gradient, the weights'.
  for eqn in products:
    assert eqn.invars[0].aval.ndim == 2, eqn
    assert eqn.params["ragged_dot_dimension_numbers"].dot_dimension_numbers[1] == ((), ())
  try:
    import libtpu  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    pytest.fail(f"libtpu is not installed ({e}); bin/setup.sh installs it")
  tpu = target.compile_target("v5e-8")
  on_chip = jax.sharding.SingleDeviceSharding(tpu.devices[0])
  arguments = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on_chip) for a in arguments]
  # A compile-only TPU client cannot read back the executables JAX's cache would keep: off
  # for this test (JAX decides at its first compile whether it uses the cache: reset, it
  # decides again; tests/conftest.py puts the setting back after the test).
  jax.config.update("jax_enable_compilation_cache", False)
  jax_compilation_cache.reset_cache()
  with target.active(tpu):
    ours.trace(*arguments).lower().compile()
    with pytest.raises(Exception, match="number of batch dimensions should be 0"):
      gradient(lambda *a: jax.lax.ragged_dot(*a, preferred_element_type=jnp.float32)).trace(
          *arguments).lower().compile()


@pytest.mark.parametrize("setting", ["softmax top-2 renormalized", "gpt-oss: biases, clamped"])
def test_capacity_that_drops_nothing_equals_dropless(setting):
  x = _inputs()
  # A factor of E / k gives each expert the whole row: no assignment can be dropped.
  roomy = _layer(setting, "capacity", EXPERTS / SETTINGS[setting][2])
  params = _params(roomy, x)
  error = np.abs(_apply(roomy, params, x) - _apply(_layer(setting), params, x)).max()
  assert error < TOLERANCE, f"{error:.2e}"
  assert expert_dispatch.capacity(10, 2, EXPERTS, EXPERTS / 2) == 10


def test_capacity_drops_past_its_slots_first_choices_first_and_counts_them():
  setting = "softmax top-2 renormalized"
  layer, x = _layer(setting, "capacity", 0.5), _inputs((2, 12))
  params = _params(layer, x)
  slots = expert_dispatch.capacity(12, 2, EXPERTS, 0.5)
  assert slots == 2
  _, experts, _, _ = _routing_numpy(params, x, setting)
  experts = experts.reshape(2, 12, 2)
  kept = np.zeros(experts.shape, bool)
  for row in range(2):  # Every first choice of the row, in token order, then every second.
    taken = np.zeros(EXPERTS, int)
    for choice in range(2):
      for token in range(12):
        expert = experts[row, token, choice]
        kept[row, token, choice] = taken[expert] < slots
        taken[expert] += 1
  assert 0 < kept.mean() < 1
  expected = _dense_reference(params, x, setting, kept.reshape(24, 2))
  with jax.default_matmul_precision("highest"):
    got, state = jax.jit(lambda p, x: layer.apply({"params": p}, x, mutable=[moe.STATISTICS]))(
        params, x)
  assert np.abs(np.asarray(got) - expected).max() < TOLERANCE
  assert np.isclose(float(state[moe.STATISTICS]["dropped"][0]), 1 - kept.mean())


@pytest.mark.parametrize("setting", ["softmax top-3 as it is", "sigmoid top-2"])
def test_the_balance_loss_and_z_loss_are_their_formulas(setting):
  layer, x = _layer(setting), _inputs()
  params = _params(layer, x)
  with jax.default_matmul_precision("highest"):
    _, state = jax.jit(lambda p, x: layer.apply({"params": p}, x, mutable=[moe.STATISTICS]))(
        params, x)
  sown = {name: np.asarray(value[0]) for name, value in state[moe.STATISTICS].items()}
  _, experts, scores, logits = _routing_numpy(params, x, setting)
  tokens, k = experts.shape
  probabilities = scores / scores.sum(-1, keepdims=True)  # A softmax's sum is already 1.
  chose = np.array([(experts == e).sum() for e in range(EXPERTS)]) / tokens
  balance = EXPERTS * np.sum(chose * probabilities.mean(0))
  assert np.isclose(sown["load_balance"], balance, rtol=1e-5)
  z = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
  assert np.isclose(sown["router_z"], z, rtol=1e-5)
  assert np.allclose(sown["expert_fraction"], chose / k, atol=1e-6)
  assert sown["dropped"] == 0


def _model(**changes):
  return MoeTransformerLM(**{**dict(vocab_size=40, num_layers=3, dim=DIM, num_heads=2,
                                    mlp_dim=20, norm="rmsnorm", mlp_activation="swiglu",
                                    num_experts=4, experts_per_token=2,
                                    mlp_kinds=("moe", "moe", "dense"),
                                    load_balance_coefficient=0.1,
                                    router_z_loss_coefficient=0.01), **changes})


def test_the_objective_adds_the_weighted_mean_losses_and_logs_them_by_expert():
  model, tokens = _model(), jnp.asarray(np.random.default_rng(3).integers(0, 40, (2, 9)))
  # Each call jitted: one program, not one compile per operation.
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), tokens)["params"])
  logits, auxiliary, statistics = jax.jit(model.logits_and_losses)(params, tokens)
  assert np.allclose(logits, jax.jit(model.apply)({"params": params}, tokens))
  _, state = jax.jit(lambda p, t: model.apply({"params": p}, t, mutable=[moe.STATISTICS]))(
      params, tokens)
  per_layer = [state[moe.STATISTICS][f"layer_{i}"]["mlp"] for i in (0, 1)]  # Layer 2: dense.
  balance = np.mean([layer["load_balance"][0] for layer in per_layer])
  z = np.mean([layer["router_z"][0] for layer in per_layer])
  assert np.isclose(float(auxiliary), 0.1 * balance + 0.01 * z, rtol=1e-6)
  assert np.isclose(float(statistics["moe_load_balance"]), balance, rtol=1e-6)
  shares = [float(statistics[f"expert_fraction/{e:03d}"]) for e in range(4)]
  assert np.isclose(sum(shares), 1.0) and len(statistics) == 3 + 4
  # Scanned (a group of the pattern, and the same statistics) gives the same.
  scanned = model.clone(scan_layers=True)
  _, auxiliary_scanned, statistics_scanned = jax.jit(scanned.logits_and_losses)(
      scanned.to_own_layout(params), tokens)
  assert np.isclose(float(auxiliary_scanned), float(auxiliary), rtol=1e-5)
  assert all(np.isclose(float(statistics_scanned[k]), float(v), rtol=1e-5, atol=1e-7)
             for k, v in statistics.items())


def test_a_train_step_follows_the_balance_loss_and_accumulates_its_statistics():
  """The router's gradient includes the balance loss's (its coefficient changes the update),
  and two micro-batches log what the batch's halves give: the linear statistics (a share of
  the tokens, a mean over them) equal the whole batch's; the balance loss, a product of two
  means, is each half's, averaged."""
  model = _model()
  rng = np.random.default_rng(4)
  batch = {"inputs": jnp.asarray(rng.integers(0, 40, (4, 8))),
           "targets": jnp.asarray(rng.integers(0, 40, (4, 8))),
           "weights": jnp.ones((4, 8), jnp.float32)}
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), batch["inputs"])["params"])
  optimizer = optax.sgd(0.1)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=jax.jit(optimizer.init)(params))

  def step(model, accumulate=1):
    return jax.jit(lambda s, b: steps.train_step(
        s, b, model=model, optimizer=optimizer, schedule=lambda _: 0.1,
        grad_accum_steps=accumulate))(state, batch)

  with jax.default_matmul_precision("highest"):
    (moved, metrics), (_, split_metrics) = step(model), step(model, 2)
    unbalanced, _ = step(model.clone(load_balance_coefficient=0.0))
    halves = [jax.jit(model.logits_and_losses)(params, batch["inputs"][rows])[2]
              for rows in (slice(0, 2), slice(2, 4))]
  router = lambda s: np.asarray(s.params["layer_0"]["mlp"]["router_kernel"])
  assert not np.allclose(router(moved), router(unbalanced), atol=1e-6)
  for key in ("loss", "moe_router_z", "expert_fraction/000", "expert_fraction/003"):
    assert np.isclose(float(metrics[key]), float(split_metrics[key]), rtol=1e-5), key
  assert np.isclose(float(split_metrics["moe_load_balance"]),
                    np.mean([float(half["moe_load_balance"]) for half in halves]), rtol=1e-5)


def test_flops_count_the_router_and_k_of_the_experts_and_memory_counts_them_all():
  """Training FLOPs per token are 6 x the weights one token multiplies (the attention's, the
  router's, k of E experts', a dense layer's MLP, the output) + attention's, counted here
  from the parameter tree; the parameter count (memory) has every expert."""
  model = _model(num_experts=8, experts_per_token=2, shared_expert_mlp_dim=12)
  tokens = jnp.zeros((1, 4), jnp.int32)
  params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens))["params"]
  active, total = 0, 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name, size = jax.tree_util.keystr(path), math.prod(leaf.shape)
    total += size
    if len(leaf.shape) < 2 or "embedding" in name:
      continue
    stacked = "['mlp']['w" in name and leaf.shape[0] == 8  # Experts [E, in, out].
    active += size * 2 // 8 if stacked else size
  assert model.num_parameters() == total
  assert model.matmul_parameters() == active
  attention = model.attention_flops_per_token(16)
  assert model.train_flops_per_token(16) == 6 * active + 3 * attention
  assert model.decode_flops_per_token(16) == 2 * active + model.decode_attention_flops(16)
