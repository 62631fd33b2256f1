"""DPO (training/objectives/dpo.py) against the published formula in NumPy: from the policy's
and the reference's log-probabilities of each sequence run alone, the loss
-(1 - e) log sigmoid(b * margin) - e log sigmoid(-b * margin) and the rewards b * (log pi - log
pi_ref) equal what the train step and the eval step report on the same pairs packed two and
one to a row."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lingvo_lite.data.packing import packed_batch
from lingvo_lite.models.llama import Llama
from lingvo_lite.training import objectives, steps
from lingvo_lite.training.objectives import dpo
from lingvo_lite.training.objectives.lm import LanguageModelling
from lingvo_lite.training.train_state import TrainState

LENGTH = 32
MODEL = Llama(vocab_size=50, num_layers=2, dim=32, num_heads=4, num_kv_heads=2, max_length=64)


def _params(seed):
  variables = MODEL.init(jax.random.key(seed), jnp.zeros((1, LENGTH), jnp.int32))
  leaves, structure = jax.tree.flatten(jax.tree.map(lambda x: x, variables["params"]))
  keys = jax.random.split(jax.random.key(seed + 100), len(leaves))
  return jax.tree.unflatten(structure, [jax.random.normal(k, x.unbox().shape if hasattr(
      x, "unbox") else x.shape) * 0.3 for k, x in zip(keys, leaves)])


def _pairs(rng):
  """Three pairs: (prompt, chosen answer, rejected answer) token lists."""
  pairs = []
  for prompt, chosen, rejected in ((3, 4, 2), (2, 3, 5), (5, 6, 4)):
    pairs.append([rng.integers(1, 50, n).tolist() for n in (prompt, chosen, rejected)])
  return pairs


def _sequence(prompt, answer):
  return np.asarray(prompt + answer), np.asarray([0.0] * len(prompt) + [1.0] * len(answer))


def _packed(pairs):
  """Rows as the preference source packs them: pairs 0 and 1 in row 0, pair 2 in row 1."""
  rows = [[0, 1], [2]]
  tokens = np.zeros((2, LENGTH), np.int32)
  weights = np.zeros((2, LENGTH), np.float32)
  starts = np.zeros((2, LENGTH), bool)
  lengths = np.zeros(2, np.int64)
  for row, members in enumerate(rows):
    at = 0
    for index in members:
      prompt, chosen, rejected = pairs[index]
      for answer in (chosen, rejected):
        ids, weight = _sequence(prompt, answer)
        tokens[row, at:at + len(ids)], weights[row, at:at + len(ids)] = ids, weight
        starts[row, at] = True
        at += len(ids)
    lengths[row] = at
  return packed_batch(tokens, weights, starts, lengths)


def _log_prob(params, ids, weights):
  """log pi(answer | prompt): the sequence run alone, its weighted targets' log-softmax summed
  in NumPy."""
  inputs = np.zeros((1, LENGTH), np.int32)  # Causal: what follows the sequence changes nothing.
  inputs[0, 1:len(ids)] = ids[:-1]
  with jax.default_matmul_precision("highest"):
    logits = np.asarray(_APPLY({"params": params}, inputs), np.float64)[0, :len(ids)]
  log_softmax = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
      -1, keepdims=True)) - logits.max(-1, keepdims=True)
  return float(np.sum(log_softmax[np.arange(len(ids)), ids] * weights))


_APPLY = jax.jit(MODEL.apply)


def _log_sigmoid(x):
  return -np.logaddexp(0.0, -x)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_dpo_loss_and_rewards_equal_the_published_formula(smoothing):
  rng = np.random.default_rng(0)
  pairs = _pairs(rng)
  policy, reference = _params(1), _params(2)
  beta = 0.5
  chosen_rewards, rejected_rewards, losses, magnitudes = [], [], [], []
  for prompt, chosen, rejected in pairs:
    logps = {}
    for name, answer in (("chosen", chosen), ("rejected", rejected)):
      ids, weights = _sequence(prompt, answer)
      logps[name] = (_log_prob(policy, ids, weights), _log_prob(reference, ids, weights))
    magnitudes.append(sum(abs(x) for pair_logps in logps.values() for x in pair_logps))
    chosen_reward = beta * (logps["chosen"][0] - logps["chosen"][1])
    rejected_reward = beta * (logps["rejected"][0] - logps["rejected"][1])
    margin = chosen_reward - rejected_reward
    losses.append(-(1 - smoothing) * _log_sigmoid(margin) - smoothing * _log_sigmoid(-margin))
    chosen_rewards.append(chosen_reward)
    rejected_rewards.append(rejected_reward)

  settings = dpo.Dpo(beta=beta, label_smoothing=smoothing)
  batch = _packed(pairs)
  sgd = optax.sgd(0.0)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=policy, opt_state=sgd.init(policy),
                     frozen=reference)
  with jax.default_matmul_precision("highest"):
    _, metrics = jax.jit(lambda s, b: steps.train_step(
        s, b, model=MODEL, optimizer=sgd, schedule=lambda _: 0.0, objective=settings,
        ravel_norm=False))(state, batch)
    sums = jax.jit(lambda p, b, f: steps.eval_step(
        p, b, f, model=MODEL, objective=settings))(policy, batch, reference)
  assert float(metrics["pairs"]) == 3 and float(sums["pairs"]) == 3
  # A pair's loss and rewards are beta x differences of four summed log-probabilities (policy
  # and reference, chosen and rejected), each of |logp| ~ 10-25 here: the model's float32
  # carries each to a few ulps, which the differences turn into absolute errors of
  # beta x sum|logp| x ulps. 2^-20 (8 ulps) bounds what the backends do: a TPU's float32
  # at the highest matmul precision missed the loss by 1.1e-5 (3.5e-7 of beta x sum|logp|;
  # bench/results/2026-12-07/tpu2/tests/), a CPU by less. A wrong formula misses by > 1e-2.
  pair_precision = beta * np.mean(magnitudes) * 2.0**-20
  np.testing.assert_allclose(float(metrics["loss"]), np.mean(losses), rtol=1e-5,
                             atol=pair_precision)
  np.testing.assert_allclose(float(metrics["reward_chosen"]), np.mean(chosen_rewards),
                             rtol=1e-5, atol=pair_precision)
  np.testing.assert_allclose(float(metrics["reward_rejected"]), np.mean(rejected_rewards),
                             rtol=1e-5, atol=pair_precision)
  np.testing.assert_allclose(float(sums["dpo_loss_sum"]), np.sum(losses), rtol=1e-5,
                             atol=pair_precision * len(pairs))
  np.testing.assert_allclose(float(sums["chosen_reward_sum"]), np.sum(chosen_rewards),
                             rtol=1e-5, atol=pair_precision * len(pairs))
  expected_accuracy = np.mean(np.asarray(chosen_rewards) > np.asarray(rejected_rewards))
  np.testing.assert_allclose(float(metrics["reward_accuracy"]), expected_accuracy)
  assert 0 < np.mean(losses) and min(abs(m) for m in np.subtract(chosen_rewards,
                                                                 rejected_rewards)) > 1e-3


class _PairSet:
  """An eval set of preference pairs, as the scorer tells one (data/preference_data.py)."""
  document_pairs = True


def test_a_language_modelling_job_scores_pairs_by_dpo_against_the_policy_itself():
  """A job without a reference evaluates a set of pairs with DPO's measures (the objective
  that reads pairs, training/objectives/__init__.py): every reward is 0, and the preference
  accuracy is how often the policy itself gives the chosen answer the larger log-probability."""
  scorer = objectives.scorer(LanguageModelling(), _PairSet())
  assert scorer == dpo.Dpo() and objectives.scorer(LanguageModelling(), object()) == (
      LanguageModelling())
  pairs = _pairs(np.random.default_rng(3))
  policy = _params(4)
  prefers = [_log_prob(policy, *_sequence(prompt, chosen)) >
             _log_prob(policy, *_sequence(prompt, rejected)) for prompt, chosen, rejected in pairs]
  with jax.default_matmul_precision("highest"):
    sums = jax.jit(lambda p, b: steps.eval_step(p, b, None, model=MODEL, objective=scorer))(
        policy, _packed(pairs))
  assert float(sums["pairs"]) == 3 and float(sums["chosen_reward_sum"]) == 0.0
  assert float(sums["rejected_reward_sum"]) == 0.0 and float(sums["reward_accuracy_sum"]) == 0
  assert float(sums["preference_accuracy_sum"]) == sum(prefers) and 0 < sum(prefers) < 3
