"""DeepSeek's mixture of experts (models/moe.py with expert_dispatch.route's groups, selection
bias and scaling; models/expert_balance.py) against independent references:

- the layer (routing, groups, top-k, weights, scaling, shared experts) equals transformers'
  own `DeepseekV3MoE` and `DeepseekV2Moe`, loaded standalone from tiny configs with every
  weight (and V3's `e_score_correction_bias`) random, within 1e-5 in float32;
- the bias update equals a NumPy of the paper's rule, through a real train step (scanned
  and unrolled, micro-batches summed, AdamW's weight decay kept off it);
- a run resumed from a checkpoint (orbax, in this process) continues the biases exactly;
- multi-token prediction's loss (models/multi_token.py, training/objectives/multi_token.py)
  equals a hand-written one in plain JAX on a tiny packed batch;
- bad group settings are one line naming the field.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from etils import epath

from lingvo_lite.checkpoints.manager import CheckpointSettings, Checkpointer
from lingvo_lite.models import expert_balance, expert_dispatch, moe
from lingvo_lite.models.moe_transformer import MoeTransformerLM
from lingvo_lite.training import steps
from lingvo_lite.training.objectives.multi_token import MultiTokenPrediction
from lingvo_lite.training.objectives.objective import Forward
from lingvo_lite.training.train_state import TrainState
from tests.models.references import rotate_half

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DIM, HIDDEN, EXPERTS, SHARED = 16, 24, 8, 2
# transformers' config changes and our layer's fields, per case.
CASES = {
    "v3: sigmoid, 4 groups choose 2 by their top-2 sum, bias, renormalized, x2.5": (
        "deepseek_v3", dict(n_group=4, topk_group=2, routed_scaling_factor=2.5,
                            norm_topk_prob=True, num_experts_per_tok=3),
        dict(router_score="sigmoid", renormalize=True, expert_groups=4, groups_per_token=2,
             group_score="top2_sum", routed_scaling=2.5, selection_bias=True,
             experts_per_token=3)),
    "v3: 2 groups choose 1, not renormalized, x1.5": (
        "deepseek_v3", dict(n_group=2, topk_group=1, routed_scaling_factor=1.5,
                            norm_topk_prob=False, num_experts_per_tok=2),
        dict(router_score="sigmoid", renormalize=False, expert_groups=2, groups_per_token=1,
             group_score="top2_sum", routed_scaling=1.5, selection_bias=True,
             experts_per_token=2)),
    "v2: softmax, 4 groups choose 2 by their best, x1.5": (
        "deepseek_v2", dict(n_group=4, topk_group=2, routed_scaling_factor=1.5,
                            topk_method="group_limited_greedy", num_experts_per_tok=3),
        dict(router_score="softmax", renormalize=False, expert_groups=4, groups_per_token=2,
             group_score="max", routed_scaling=1.5, experts_per_token=3)),
    "v2: greedy (no groups)": (
        "deepseek_v2", dict(topk_method="greedy", num_experts_per_tok=2),
        dict(router_score="softmax", renormalize=False, experts_per_token=2)),
}


def _hf_layer(kind, changes, generator):
  """transformers' MoE module of a tiny config, every weight random (O(1) router logits,
  a selection bias that changes choices)."""
  config = dict(hidden_size=DIM, num_attention_heads=2, num_key_value_heads=2,
                moe_intermediate_size=HIDDEN, n_routed_experts=EXPERTS,
                n_shared_experts=SHARED, **changes)
  if kind == "deepseek_v3":
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling
    layer = modeling.DeepseekV3MoE(transformers.DeepseekV3Config(**config))
  else:
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as modeling
    layer = modeling.DeepseekV2Moe(transformers.DeepseekV2Config(**config))
  with torch.no_grad():
    for name, tensor in layer.state_dict().items():
      scale = (0.05 if name.endswith("correction_bias") else
               1.0 / math.sqrt(tensor.shape[-1]) if tensor.ndim > 1 else 1.0)
      tensor.copy_(torch.tensor(generator.normal(size=tensor.shape) * scale))
  return layer.float().eval()


def _our_params(layer):
  """The HF module's weights as our layer's parameters."""
  weights = {name: tensor.detach().numpy() for name, tensor in layer.state_dict().items()}
  gate_up = weights["experts.gate_up_proj"]  # [E, 2 x hidden, dim]: gate rows, then up.
  params = {"router_kernel": weights["gate.weight"].T,
            "wi": np.swapaxes(gate_up[:, :HIDDEN], 1, 2),
            "wi_gate": np.swapaxes(gate_up[:, HIDDEN:], 1, 2),
            "wo": np.swapaxes(weights["experts.down_proj"], 1, 2),
            "shared": {name: {"kernel": weights[f"shared_experts.{hf}.weight"].T}
                       for name, hf in (("wi", "gate_proj"), ("wi_gate", "up_proj"),
                                        ("wo", "down_proj"))}}
  if "gate.e_score_correction_bias" in weights:
    params["selection_bias"] = weights["gate.e_score_correction_bias"]
  return jax.tree.map(jnp.asarray, params)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_layer_equals_transformers_deepseek_moe(case):
  kind, hf_changes, fields = CASES[case]
  generator = np.random.default_rng(7)
  hf = _hf_layer(kind, hf_changes, generator)
  x = generator.normal(size=(4, 16, DIM)).astype(np.float32)
  ours = moe.MoeMlp(num_experts=EXPERTS, mlp_dim=HIDDEN, shared_mlp_dim=SHARED * HIDDEN,
                    **fields)
  params = _our_params(hf)
  with torch.no_grad():
    expected = hf(torch.tensor(x)).numpy()
    _, hf_weights, hf_experts = hf.gate(torch.tensor(x))
  with jax.default_matmul_precision("highest"):
    got = np.asarray(jax.jit(ours.apply)({"params": params}, jnp.asarray(x)))
    logits = x.reshape(-1, DIM) @ np.asarray(params["router_kernel"])
    groups = expert_dispatch.ExpertGroups(fields.get("expert_groups", 1),
                                          fields.get("groups_per_token", 1),
                                          fields.get("group_score", "max"))
    routing = expert_dispatch.route(
        jnp.asarray(logits), fields["experts_per_token"], fields["router_score"],
        fields["renormalize"], groups, params.get("selection_bias"), fields.get(
            "routed_scaling", 1.0))
  # The same experts, each with the same weight (transformers' top-k is unsorted).
  order = np.argsort(hf_experts.numpy(), axis=-1)
  ours_order = np.argsort(np.asarray(routing.experts), axis=-1)
  np.testing.assert_array_equal(np.take_along_axis(np.asarray(routing.experts), ours_order, -1),
                                np.take_along_axis(hf_experts.numpy(), order, -1))
  np.testing.assert_allclose(np.take_along_axis(np.asarray(routing.weights), ours_order, -1),
                             np.take_along_axis(hf_weights.numpy(), order, -1), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
  if "selection_bias" in params:  # The bias changes choices here: ignoring it would show.
    unbiased = expert_dispatch.route(jnp.asarray(logits), fields["experts_per_token"],
                                     fields["router_score"], fields["renormalize"], groups)
    assert not np.array_equal(np.sort(unbiased.experts, -1), np.sort(routing.experts, -1))


def _model(**changes):
  """A tiny DeepSeek-V3-style MoE transformer: sigmoid scores, 4 groups of 2 experts (a
  token's 2 from its best 2), shared experts, the first layer dense, a selection bias."""
  return MoeTransformerLM(**{**dict(
      vocab_size=40, num_layers=3, dim=DIM, num_heads=2, mlp_dim=20, norm="rmsnorm",
      mlp_activation="swiglu", num_experts=8, experts_per_token=2, expert_groups=4,
      expert_groups_per_token=2, group_score="top2_sum", router_score="sigmoid",
      routed_scaling_factor=2.5, shared_expert_mlp_dim=12, first_dense_layers=1,
      selection_bias=True, selection_bias_rate=0.01, load_balance_coefficient=0.0), **changes})


def _batch(rows=4, length=8, seed=4):
  rng = np.random.default_rng(seed)
  return {"inputs": jnp.asarray(rng.integers(0, 40, (rows, length))),
          "targets": jnp.asarray(rng.integers(0, 40, (rows, length))),
          "weights": jnp.ones((rows, length), jnp.float32)}


def _flat(tree):
  return {jax.tree_util.keystr(path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("layout", ["unrolled, first layer dense", "scanned"])
def test_a_train_step_moves_each_bias_by_the_papers_rule(layout):
  """After a step, each MoE layer's bias is b + rate x sign(mean load - load) (NumPy) of the
  loads its forward pass counted (every assignment of the batch's tokens), whatever AdamW's
  weight decay would make of it; two micro-batches give the same; the other parameters are
  the optimizer's."""
  model = (_model() if layout.startswith("unrolled") else
           _model(first_dense_layers=0, num_layers=2, scan_layers=True))
  batch = _batch()
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), batch["inputs"])["params"])
  assert model.num_parameters() == sum(p.size for p in jax.tree.leaves(params))  # Biases in.
  generator = np.random.default_rng(5)
  params = jax.tree_util.tree_map_with_path(
      lambda path, p: jnp.asarray(generator.normal(size=p.shape) * 0.1, p.dtype)
      if "selection_bias" in jax.tree_util.keystr(path) else p, params)
  optimizer = optax.adamw(0.1, weight_decay=0.5, mask=None)  # Decays the biases too.
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=jax.jit(optimizer.init)(params))

  def step(accumulate):
    return jax.jit(lambda s, b: steps.train_step(
        s, b, model=model, optimizer=optimizer, schedule=lambda _: 0.1,
        grad_accum_steps=accumulate))(state, batch)

  (moved, metrics), (split, _) = step(1), step(2)
  _, sown = jax.jit(lambda p, x: model.apply({"params": p}, x, mutable=[moe.STATISTICS]))(
      params, batch["inputs"])
  loads = {key.replace("['expert_load'][0]", "['selection_bias']"): value
           for key, value in _flat(sown[moe.STATISTICS]).items() if "expert_load" in key}
  rows = np.concatenate([load.reshape(-1, EXPERTS) for load in loads.values()])
  assert rows.shape == (2, EXPERTS) and (rows.sum(-1) == 32 * 2).all()  # Tokens x k a layer.
  before, after, after_split = _flat(params), _flat(moved.params), _flat(split.params)
  plain = _flat(jax.jit(lambda s: optax.apply_updates(s.params, optimizer.update(
      jax.tree.map(jnp.zeros_like, s.params), s.opt_state, s.params)[0]))(state))
  for key, value in after.items():
    if key in loads:
      load = loads[key].astype(np.float64)
      expected = before[key] + 0.01 * np.sign(load.mean(-1, keepdims=True) - load)
      np.testing.assert_allclose(value, expected, rtol=0, atol=1e-7, err_msg=key)
      assert not np.allclose(plain[key], before[key])  # AdamW alone would have moved it.
      np.testing.assert_array_equal(after_split[key], value)
    else:
      assert not np.array_equal(value, before[key]) or "bias" in key, key
  assert float(metrics["moe_selection_bias_spread"]) > 0 and "expert_loads" not in metrics


def _train_run(model, batches):
  """The per-step (load CV, loss) of training `model` (from one seed) on `batches`, all the
  steps in one compiled scan (a tiny model's step is dispatch, not arithmetic); the init
  jitted too (op by op, its MoE layers are a hundred compiles)."""
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), batches["inputs"][0])["params"])
  optimizer = optax.adam(1e-2)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=jax.jit(optimizer.init)(params))

  def body(state, batch):
    state, metrics = steps.train_step(state, batch, model=model, optimizer=optimizer,
                                      schedule=lambda _: 1e-2, log_grad_norm=False)
    return state, (metrics["moe_load_cv"], metrics["loss"])

  _, (cv, loss) = jax.jit(lambda s, b: jax.lax.scan(body, s, b))(state, batches)
  return np.asarray(cv), np.asarray(loss)


def test_the_bias_alone_balances_the_load_over_200_steps_and_the_loss_still_falls():
  """200 steps of a tiny MoE (16 experts in 4 groups, sigmoid scores, no auxiliary loss) on
  learnable sequences (arithmetic progressions mod 32): with the bias (rate 0.01: the paper's
  0.001 is for runs of many thousand steps) the experts' load CV falls below half of its
  first step's and well below the same run's without the bias (rate 0), and the loss falls."""
  rng = np.random.default_rng(0)
  start, stride = rng.integers(0, 32, (200, 8, 1)), rng.integers(1, 4, (200, 8, 1))
  sequences = (start + stride * np.arange(17)) % 32
  batches = {"inputs": jnp.asarray(sequences[..., :-1]),
             "targets": jnp.asarray(sequences[..., 1:]),
             "weights": jnp.ones((200, 8, 16), jnp.float32)}
  model = _model(vocab_size=32, num_layers=1, first_dense_layers=0, num_experts=16,
                 expert_mlp_dim=8, dispatch="dense", routed_scaling_factor=1.0)
  cv, loss = _train_run(model, batches)
  cv_without, _ = _train_run(model.clone(selection_bias_rate=0.0), batches)
  assert cv[0] == cv_without[0] and cv[0] > 0.5  # The same start: unbalanced.
  assert cv[-20:].mean() < 0.5 * cv[0]
  assert cv[-20:].mean() < 0.6 * cv_without[-20:].mean()
  assert loss[-10:].mean() < 0.5 * loss[:10].mean()


def _rms(x, scale, eps=1e-5):
  return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * scale


def _block(p, x, positions, segment_ids):
  """A pre-RMSNorm block in plain JAX: rotate-half attention within each document, SwiGLU."""
  h = _rms(x, p["attention_norm"]["scale"])
  a = p["attention"]
  q, k, v = (jnp.einsum("btd,dhk->bthk", h, a[f"{name}_kernel"])
             for name in ("query", "key", "value"))
  q, k = (jax.vmap(rotate_half)(t, positions) for t in (q, k))
  scores = jnp.einsum("bthk,bshk->bhts", q, k) / math.sqrt(q.shape[-1])
  length = x.shape[1]
  allowed = (jnp.tril(jnp.ones((length, length), bool))[None]
             & (segment_ids[:, :, None] == segment_ids[:, None, :]))
  scores = jnp.where(allowed[:, None], scores, -1e30)
  out = jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(scores, -1), v)
  x = x + jnp.einsum("bthk,hkd->btd", out, a["out_kernel"])
  h = _rms(x, p["mlp_norm"]["scale"])
  m = p["mlp"]
  hidden = jax.nn.silu(h @ m["wi"]["kernel"]) * (h @ m["wi_gate"]["kernel"])
  return x + hidden @ m["wo"]["kernel"]


def _multi_token_loss_by_hand(params, batch, weight, depths):
  """DeepSeek-V3's objective written out: the next-token cross-entropy over the weighted
  tokens, plus weight / D x sum over modules k of the cross-entropy of token i + k + 1 from
  [enorm(embedding of token i + k); hnorm(h^{k-1}_i)] -> projection -> block -> norm -> the
  shared head, where position i + k is in position i's document; both sums over the batch's
  weighted tokens."""
  tokens, targets, weights = batch["inputs"], batch["targets"], batch["weights"]
  segment_ids, positions = batch["segment_ids"], batch["positions"]
  x = _block(params["layer_0"], params["embedding"][tokens], positions, segment_ids)
  hidden = _rms(x, params["final_norm"]["scale"])

  def cross_entropy(normed, labels):
    logits = normed @ params["output"]["kernel"]
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1)[..., 0]

  total = jnp.sum(weights)
  loss = jnp.sum(cross_entropy(hidden, targets) * weights) / total
  length = tokens.shape[1]
  for k in range(1, depths + 1):
    module = params[f"multi_token_{k - 1}"]
    later = np.minimum(np.arange(length) + k, length - 1)  # Past the row: never scored.
    scored = ((np.arange(length) + k < length)[None]
              & (segment_ids[:, later] == segment_ids)) * weights[:, later]
    joined = jnp.concatenate([_rms(params["embedding"][tokens[:, later]],
                                   module["embedding_norm"]["scale"]),
                              _rms(hidden, module["hidden_norm"]["scale"])], -1)
    hidden = _block(module["block"], joined @ module["projection"]["kernel"], positions,
                    segment_ids)
    normed = _rms(hidden, module["final_norm"]["scale"])
    loss += weight / depths * jnp.sum(cross_entropy(normed, targets[:, later]) * scored) / total
  return loss


def test_multi_token_prediction_loss_equals_a_hand_written_one():
  """Two modules over a one-layer model on packed rows (two documents a row, padding):
  the objective's loss equals the written-out one within 1e-5, and its gradient reaches the
  modules; the model's plain logits (decoding's) are the next-token ones alone."""
  model = MoeTransformerLM(vocab_size=40, num_layers=1, dim=DIM, num_heads=2, mlp_dim=20,
                           norm="rmsnorm", mlp_activation="swiglu", mlp_kinds=("dense",),
                           multi_token_layers=2)
  rng = np.random.default_rng(6)
  segment_ids = np.array([[1] * 5 + [2] * 6 + [0], [1] * 9 + [2] * 3], np.int32)
  positions = np.concatenate([np.arange(5), np.arange(6), [0]])[None].repeat(2, 0)
  positions[1] = np.concatenate([np.arange(9), np.arange(3)])
  batch = {"inputs": jnp.asarray(rng.integers(0, 40, (2, 12))),
           "targets": jnp.asarray(rng.integers(0, 40, (2, 12))),
           "weights": jnp.asarray((segment_ids > 0) * rng.uniform(0.5, 1.0, (2, 12)),
                                  jnp.float32),
           "segment_ids": jnp.asarray(segment_ids), "positions": jnp.asarray(positions)}
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(3), batch["inputs"])["params"])
  params = jax.tree.map(lambda p: p + 0.1 * jnp.asarray(rng.normal(size=p.shape), p.dtype),
                        params)  # The norms' scales off 1.
  objective = MultiTokenPrediction(weight=0.3)
  total = jnp.sum(batch["weights"])
  with jax.default_matmul_precision("highest"):
    (loss, sums), grads = jax.jit(jax.value_and_grad(
        lambda p: objective.loss(Forward(model), p, batch, total), has_aux=True))(params)
    expected = jax.jit(lambda p: _multi_token_loss_by_hand(p, batch, 0.3, 2))(params)
    plain = jax.jit(model.apply)({"params": params}, batch["inputs"], batch["segment_ids"],
                                 batch["positions"])
  np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)
  # The logged loss is the next-token one, of the logits decoding gets.
  next_token = -np.take_along_axis(np.asarray(jax.nn.log_softmax(plain)),
                                   np.asarray(batch["targets"])[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(sums["cross_entropy_sum"]),
                             np.sum(next_token * np.asarray(batch["weights"])), rtol=1e-5)
  assert all(np.abs(g).max() > 0 for g in jax.tree.leaves(grads["multi_token_1"]))
  # The modules are parameters: counted from the sizes alone as `init` makes them.
  assert model.num_parameters() == sum(p.size for p in jax.tree.leaves(params))
  assert sum(math.prod(shape.shape) * shape.repeats for shape in model.parameter_shapes()) == (
      model.num_parameters())


def test_a_run_resumed_from_a_checkpoint_continues_the_biases_exactly(tmp_path):
  """2 steps, a checkpoint, 2 more: the restored run's parameters (the biases among them,
  which moved) equal the uninterrupted run's bit for bit."""
  model = _model()
  optimizer = optax.adamw(1e-2)
  batches = [_batch(seed=seed) for seed in range(4)]
  params = nn.meta.unbox(model.init(jax.random.key(0), batches[0]["inputs"])["params"])
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(params))
  step = jax.jit(lambda s, b: steps.train_step(s, b, model=model, optimizer=optimizer,
                                               schedule=lambda _: 1e-2)[0])
  for batch in batches[:2]:
    state = step(state, batch)
  checkpointer = Checkpointer(epath.Path(tmp_path), CheckpointSettings(async_save=False))
  checkpointer.save(2, state)
  assert checkpointer.wait() == [2]
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                          state)
  resumed = checkpointer.restore(2, abstract)
  checkpointer.close()
  bias = lambda s: np.asarray(s.params["layer_1"]["mlp"]["selection_bias"])
  saved_bias = bias(state)
  np.testing.assert_array_equal(bias(resumed), saved_bias)
  for batch in batches[2:]:
    state, resumed = step(state, batch), step(resumed, batch)
  assert not np.array_equal(bias(state), saved_bias)  # It moved after the resume.
  for key, value in _flat(state.params).items():
    np.testing.assert_array_equal(_flat(resumed.params)[key], value, err_msg=key)
