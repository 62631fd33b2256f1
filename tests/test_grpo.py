"""GRPO (training/objectives/grpo.py) against independent computations: the loss and its
gradient per variant against TRL's `GRPOTrainer._compute_loss` on the same log-probabilities,
advantages and masks; the advantages against NumPy group by group; the rollouts' log-probs
against a teacher-forced forward of the same tokens (full fine-tune and LoRA); a rollout
resumed from a step's state against the uninterrupted one; bad settings in one line."""

import collections
import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite import testing
from lingvo_lite.config import fiddlers, overrides
from lingvo_lite.errors import UsageError
from lingvo_lite.models.lora import LoraSettings
from lingvo_lite.rewards import registry
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.training.objectives import grpo_batch, grpo_math
from lingvo_lite.training.objectives.grpo import Grpo
from lingvo_lite.training.objectives.objective import Forward, token_losses


_REWARD = "test_grpo_length_mod_3"


@dataclasses.dataclass(frozen=True)
class _Prompts:
  """A source of prompt records (ids: the tiny setup has no text vocabulary)."""

  global_batch_size: int = 2
  sequence_length: int = 32
  num_batches: None = None
  prompt_records = True

  def batch(self, step, process_index=0, process_count=1):
    del process_index, process_count
    rng = np.random.default_rng(step)
    return {"records": [{"id": f"{step}-{i}", "prompt_ids": rng.integers(1, 50, 3 + i).tolist()}
                        for i in range(self.global_batch_size)]}

  def batch_spec(self):
    return {}


@registry.register(_REWARD)
def _length_mod_3(record, completion):
  """A reward that varies within a group: the completion's text length mod 3."""
  del record
  return float(len(completion) % 3)


# ------------------------------------------------------------------------------- TRL's loss


def _trl_loss(log_probs, old, reference, advantages, mask, loss_type, level, epsilons, beta):
  """TRL 1.16's `_compute_loss` on these inputs (its model call replaced by the log-probs),
  and the gradient of its loss with respect to the log-probs."""
  torch = pytest.importorskip("torch")
  grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
  rows, length = log_probs.shape
  leaf = torch.tensor(log_probs, dtype=torch.float64, requires_grad=True)
  accelerator = types.SimpleNamespace(
      num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x,
      reduce=lambda x, reduction: x, sync_gradients=True)
  trainer = types.SimpleNamespace(
      top_entropy_quantile=1.0, off_policy_mask_threshold=None,
      importance_sampling_level=level, beta=beta, loss_type=loss_type,
      args=types.SimpleNamespace(use_bias_correction_kl=False, delta=None,
                                 steps_per_generation=1),
      epsilon_low=epsilons[0], epsilon_high=epsilons[1], use_vllm=False,
      vllm_importance_sampling_correction=False, model=types.SimpleNamespace(training=True),
      current_gradient_accumulation_steps=1, max_completion_length=length,
      _entropy_bonus_enabled=False, aux_loss_enabled=False, accelerator=accelerator,
      _metrics={"train": collections.defaultdict(list)},
      _get_per_token_logps_and_entropies=lambda *a, **k: (leaf, torch.zeros_like(leaf), None))
  as_tensor = lambda x: torch.tensor(x, dtype=torch.float64)
  inputs = {"prompt_ids": torch.zeros((rows, 2), dtype=torch.long),
            "prompt_mask": torch.ones((rows, 2)),
            "completion_ids": torch.zeros((rows, length), dtype=torch.long),
            "completion_mask": as_tensor(mask), "advantages": as_tensor(advantages),
            "num_items_in_batch": as_tensor(mask.sum())}
  if old is not None:
    inputs["old_per_token_logps"] = as_tensor(old)
  if beta:
    inputs["ref_per_token_logps"] = as_tensor(reference)
  compute_loss = grpo_trainer.GRPOTrainer._compute_loss  # pylint: disable=protected-access
  loss = compute_loss(trainer, None, inputs)
  loss.backward()
  return loss.item(), leaf.grad.numpy()


def test_loss_and_gradient_equal_trls_per_variant():
  rng = np.random.default_rng(0)
  rows, length = 6, 7
  log_probs = -rng.uniform(0.1, 3.0, (rows, length))
  old = log_probs + rng.normal(0, 0.3, (rows, length))  # Ratios on both sides of the clip.
  reference = log_probs + rng.normal(0, 0.5, (rows, length))
  mask = (np.arange(length)[None] < rng.integers(1, length + 1, rows)[:, None]).astype(float)
  advantages = rng.normal(0, 1, rows)
  epsilons = (0.2, 0.28)
  with jax.enable_x64(True):
    for aggregation, loss_type in (("sequence", "grpo"), ("token", "dapo"),
                                   ("constant", "dr_grpo")):
      for importance in ("token", "sequence"):
        for beta in (0.0, 0.04):
          for several_updates in (False, True):

            def loss(x):
              before = jnp.asarray(old) if several_updates else jax.lax.stop_gradient(x)
              terms = grpo_math.token_terms(
                  x, before, jnp.asarray(reference), jnp.asarray(advantages),
                  jnp.asarray(mask), epsilon_low=epsilons[0], epsilon_high=epsilons[1],
                  kl_coef=beta, importance=importance)
              return (grpo_math.loss_sum(terms.loss, jnp.asarray(mask), aggregation)
                      / grpo_math.normalizer(jnp.asarray(mask), aggregation, length))

            ours, gradient = jax.value_and_grad(loss)(jnp.asarray(log_probs))
            theirs, their_gradient = _trl_loss(
                log_probs, old if several_updates else None, reference, advantages, mask,
                loss_type, importance, epsilons, beta)
            case = (aggregation, importance, beta, several_updates)
            np.testing.assert_allclose(float(ours), theirs, rtol=1e-12, atol=1e-14,
                                       err_msg=str(case))
            np.testing.assert_allclose(np.asarray(gradient), their_gradient, rtol=1e-12,
                                       atol=1e-14, err_msg=str(case))


def test_advantages_equal_numpy_per_group():
  rng = np.random.default_rng(1)
  group = 4
  rewards = rng.integers(0, 3, 5 * group).astype(np.float32)
  rewards[:group] = 1.0  # A group whose rewards are all equal: advantages 0, not NaN.
  for scale in grpo_math.ADVANTAGE_SCALES:
    found = grpo_math.group_advantages(rewards, group, scale)
    for start in range(0, len(rewards), group):
      members = rewards[start:start + group].astype(np.float64)
      expected = members - members.mean()
      if scale == "group":
        expected = expected / (np.std(members, ddof=1) + 1e-4)
      np.testing.assert_allclose(found[start:start + group], expected, rtol=1e-6, atol=1e-6)
  zero = grpo_math.zero_variance_groups(rewards, group)
  for start in range(0, len(rewards), group):
    members = rewards[start:start + group]
    assert np.all(zero[start:start + group] == float(np.ptp(members) == 0))


# ------------------------------------------------------------------------------- rollouts


def _grpo_setup(objective, lora=None):
  setup = testing.synthetic_tiny_setup("PyCodeTiny", "decode.slots=4")
  train = dataclasses.replace(setup.train, objective=objective, lora=lora)
  return dataclasses.replace(setup, train_data=_Prompts(), train=train)


def _state(jitted, perturb_adapters=False):
  frozen = jitted.frozen.load()[0] if jitted.frozen is not None else None
  state = jitted.init_state(frozen)
  if perturb_adapters:  # B starts at 0: an adapter that changes nothing would prove nothing.
    keys = iter(jax.random.split(jax.random.key(3), len(jax.tree.leaves(state.params))))
    state = state.replace(params=jax.tree.map(
        lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape, x.dtype), state.params))
  return state


def _teacher_forced(jitted, state, batch):
  """Each target's log-probability under `state`'s policy, the rows run whole (no cache)."""
  forward = Forward(jitted.model, state.frozen, jitted.adapters)
  logits = forward.logits(state.params, {"inputs": jnp.asarray(batch["inputs"])})
  return -np.asarray(token_losses(logits, jnp.asarray(batch["targets"]))[0])


def test_lora_rollout_log_probs_equal_a_teacher_forced_forward():
  """The adapters as decode applies them (merged into the base) sample with the log-probs of
  the adapted model the loss runs."""
  objective = Grpo(rewards=((_REWARD, 1.0),), group_size=3, max_new_tokens=6)
  setup = _grpo_setup(objective, LoraSettings(rank=2))
  jitted = JittedSteps(setup)
  with jitted.activated():
    state = _state(jitted, perturb_adapters=True)
    batch = objective.training_batch(setup.train_data.batch(0), state, jitted)
    teacher_forced = _teacher_forced(jitted, state, batch)
    base_only = _teacher_forced(jitted, state.replace(params=jax.tree.map(
        jnp.zeros_like, state.params)), batch)
  weights = batch["weights"]
  assert weights.sum() > 0 and batch["inputs"].shape[0] == 6
  np.testing.assert_allclose(batch["old_log_probs"] * weights, teacher_forced * weights,
                             rtol=1e-5, atol=1e-5)
  assert np.abs((base_only - teacher_forced) * weights).max() > 1e-2  # The adapters count.


def test_rollouts_are_the_policys_and_resume_exactly():
  """Full fine-tune, two updates per rollout, KL to the reference: the rollout's log-probs are
  a teacher-forced forward's; steps 2..3 from step 2's state with nothing remembered (a
  resumed process) sample and train exactly as the uninterrupted run."""
  objective = Grpo(rewards=((_REWARD, 1.0),), group_size=3, max_new_tokens=6,
                   updates_per_batch=2, kl_coef=0.05)
  setup = _grpo_setup(objective)
  source = setup.train_data
  jitted = JittedSteps(setup)

  def run(state, steps):
    rows = []
    for step in steps:
      batch = jitted.training_batch(source.batch(step), state)
      state, metrics = jitted.train_step(state, batch)
      rows.append((jax.device_get(batch), jax.device_get(metrics)))
    return state, rows

  with jitted.activated():
    state = _state(jitted)
    first = objective.training_batch(source.batch(0), state, jitted)
    records = source.batch(0)["records"]
    sampled = jitted.rollouts.complete(state, records, jitted.rollouts.sampling(
        3, 6, 1.0, 1.0, setup.train.seed), 0)  # The decode engine's own log-probs.
    decoded = grpo_batch.token_rows(
        [c.prompt_ids for c in sampled], [c.completion_ids for c in sampled],
        [c.logprobs for c in sampled], source.sequence_length, ["-"] * len(sampled))
    teacher_forced = _teacher_forced(jitted, state, first)
    weights = first["weights"]
    np.testing.assert_array_equal(decoded["inputs"], first["inputs"])
    for old in (decoded["old_log_probs"], first["old_log_probs"]):
      np.testing.assert_allclose(old * weights, teacher_forced * weights, rtol=1e-5, atol=1e-5)
    state, _ = run(state, [0, 1])
    saved = jax.device_get(state)
    whole, rows = run(state, [2, 3])
    jitted.rollouts.memo = None  # What a new process has: no rollout in memory.
    restored = jax.device_put(saved, jitted.sharded_state.shardings)
    resumed, resumed_rows = run(restored, [2, 3])
  for (batch, metrics), (again, again_metrics) in zip(rows, resumed_rows):
    for key in batch:
      if key != "rollout_seconds":
        np.testing.assert_array_equal(np.asarray(batch[key]), np.asarray(again[key]), key)
    assert metrics["loss"] == again_metrics["loss"]
  assert rows[1][1]["kl"] > 0  # The second update moved away from the reference.
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(whole.params),
               jax.device_get(resumed.params))


# ------------------------------------------------------------------------------- bad settings


def test_bad_settings_name_their_field(tmp_path):
  """The fields' own ranges (at build), then the settings that must fit the rest of the setup
  (Setup.validate: `check_setup`)."""
  ranges = ("group_size=1", "kl_coef=-0.1", "epsilon_low=0.0", "epsilon_high=1.0",
            "epsilon_high=1.5", "top_p=0.0", "temperature=0.0")
  for setting in ranges:
    cfg = testing.tiny_config("PyCodeTiny", synthetic=True)
    fiddlers.grpo(cfg)
    with pytest.raises(UsageError) as raised:  # Refused as the override is applied.
      overrides.apply(cfg, [overrides.set_directive(f"--fdl.train.objective.{setting}",
                                                    f"train.objective.{setting}")], None)
    message = str(raised.value)
    assert message.startswith(f"--fdl.train.objective.{setting}: must be "), message
    assert "\n" not in message, message
  setup = testing.synthetic_tiny_setup("PyCodeTiny", "train.steps=4",
                                       "checkpoint.every_steps=2")
  for fields, named in (({"max_new_tokens": 64}, "max_new_tokens=64"),  # Cache: 64 tokens.
                        ({"updates_per_batch": 3, "max_new_tokens": 16}, "updates_per_batch=3")):
    with pytest.raises(UsageError) as raised:
      Grpo(**fields).check_setup("train.objective", setup)
    assert str(raised.value).startswith(f"train.objective.{named}:"), str(raised.value)
  Grpo(max_new_tokens=32, updates_per_batch=2).check_setup("train.objective", setup)
  with pytest.raises(UsageError) as raised:
    Grpo(rewards=(("no_such_reward", 1.0),)).check("train.objective", _Prompts())
  assert str(raised.value).startswith("train.objective.rewards[0]="), str(raised.value)
  # An eval set of prompt records: nothing scores it, refused before the run.
  setup = _grpo_setup(Grpo(rewards=((_REWARD, 1.0),), max_new_tokens=16))
  with pytest.raises(UsageError) as raised:
    dataclasses.replace(setup, eval_data=_Prompts()).validate()
  assert str(raised.value).startswith("eval_data='_Prompts': holds prompt records"), (
      str(raised.value))
  # From the command line: one line, exit 2, nothing written.
  result = testing.run_cli(["--exp=SmolLM2Grpo", f"--job_log_dir={tmp_path}/job",
                            "--fdl.train.objective.rewards=(('nope', 1.0),)"])
  assert result.code == 2, result
  assert result.stderr.count("\n") == 1, result.stderr
  assert "train.objective.rewards[0]='nope'" in result.stderr, result.stderr
  assert not (tmp_path / "job").exists()


def test_the_report_draws_each_reward_function():
  """`reward:*` becomes one plot per reward the job's rows hold, beside GRPO's other plots."""
  from lingvo_lite.report import plots  # pylint: disable=import-outside-toplevel
  job = types.SimpleNamespace(train=[
      {"step": 1, "reward:exact_answer": 0.0, "reward:answer_format": 0.5, "loss": 0.1},
      {"step": 2, "reward:exact_answer": 0.25, "reward:answer_format": 0.75, "loss": 0.0}])
  keys = [q.key for q in plots.expanded(plots.objective_quantities([Grpo]), [job])]
  assert "reward:*" not in keys
  assert keys.index("reward:answer_format") + 1 == keys.index("reward:exact_answer")
  assert {"pass_rate", "kl", "clip_fraction", "entropy", "zero_variance",
          "rollout_s"} <= set(keys)
