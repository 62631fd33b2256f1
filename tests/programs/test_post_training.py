"""Post-training through the programs, in this process: a LoRA job over a Hugging Face base
keeps only its adapters, resumes only over the base it was trained on, and decodes as its
merged model; QLoRA with DPO on a preference store reports its rewards (metrics, eval, the run
report); the memory verdict counts adapters, a frozen base (int8 for QLoRA) and a reference."""

import json
import os

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from lingvo_lite import memory_fit
from lingvo_lite.checkpoints.manager import CheckpointSettings
from lingvo_lite.data.preference_data import PreferenceStoreData
from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer
from lingvo_lite.data.synthetic import SyntheticData
from lingvo_lite.experiment import TrainLoop, setup_config
from lingvo_lite.models import lora
from lingvo_lite.models.llama import Llama
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.testing import run_cli
from lingvo_lite.training.objectives.dpo import Dpo
from lingvo_lite.training.optimizers import AdamW
from lingvo_lite.weights import frozen_weights
from lingvo_lite.weights.job_params import JobParams
from tasks.formats.preference import preference_task
from tests.data import chat_tokenizers
from tests.weights import tiny_weights
from tests.trained_jobs import tree_digest

PROGRAM = ["--fdl_config=tests.programs.test_post_training.lora_config"]


def lora_config() -> fdl.Config:
  """A Setup without a model (--init_from=hf: gives it) training LoRA adapters on synthetic
  tokens of the tiny base's vocabulary."""
  return setup_config(
      optimizer=fdl.Config(AdamW, peak_learning_rate=2e-2, warmup_steps=0, weight_decay=0.0),
      train_data=fdl.Config(SyntheticData, vocab_size=tiny_weights.FIELDS["vocab_size"],
                            sequence_length=32, global_batch_size=2),
      train=fdl.Config(TrainLoop, steps=2, log_every_steps=1,
                       lora=fdl.Config(lora.LoraSettings, rank=4)),
      checkpoint=fdl.Config(CheckpointSettings, every_steps=2))


def test_a_lora_job_keeps_its_adapters_resumes_over_its_base_and_decodes_merged(
    tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  tiny_weights.hf_folder(tmp_path / "base")
  trained = run_cli([*PROGRAM, "--init_from=hf:base", "--job_log_dir=job"])
  assert trained.code == 0, trained.stderr
  assert "(LoRA: 0.0" in trained.stdout and "trained, the rest frozen)" in trained.stdout

  # The checkpoint holds the adapters and their moments alone, and the base's fingerprint.
  from lingvo_lite.config import building, files as config_files  # pylint: disable=g-import-not-at-top
  setup = building.build(config_files.load(epath.Path("job/config.json"), "job"))
  opened = JobParams(setup, epath.Path(tmp_path / "job"))
  choice = opened.choose()
  jitted = JittedSteps(setup, opened.mesh)
  state = jitted.restore_state(choice.checkpointer, choice.step)
  assert state.frozen is None and lora.kernel_paths(state.params)
  assert all(path.endswith((lora.A_SUFFIX, lora.B_SUFFIX))
             for path in lora.flatten(state.params))
  adapter_count = lora.adapter_count(state.params)
  moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim]  # Not the step counters.
  assert sum(x.size for x in moments) == 2 * adapter_count
  recorded = choice.checkpointer.metadata(choice.step)[frozen_weights.METADATA_KEY]
  assert recorded.startswith("sha256:")

  # Decode runs the adapter job itself: its greedy tokens are the merged model's.
  (tmp_path / "prompts.jsonl").write_text(json.dumps(
      {"prompt_ids": [5, 6, 7, 8], "max_new_tokens": 4, "temperature": 0}) + "\n")
  decoded = run_cli(["--mode=decode", "--job_log_dir=job", "--prompts_file=prompts.jsonl",
                     "--decode_out=-"])
  assert decoded.code == 0, decoded.stderr
  completion = json.loads(decoded.stdout.splitlines()[0])["completion_ids"]
  merged, _ = opened.load()
  tokens = np.zeros((1, 8), np.int32)  # One shape, one compile: the model is causal.
  tokens[0, :4] = [5, 6, 7, 8]
  forward = jax.jit(setup.model.apply)
  for position in range(4, 8):
    logits = forward({"params": merged}, jnp.asarray(tokens))
    tokens[0, position] = int(jnp.argmax(logits[0, position - 1]))
  assert completion == tokens[0, 4:].tolist()

  # Another base under the same path: the resume is refused, and nothing of the job changes.
  tiny_weights.hf_folder(tmp_path / "base", replaced={"model.norm.weight": np.full(
      tiny_weights.FIELDS["dim"], 2.0, np.float32)})
  before = tree_digest(tmp_path / "job")
  resumed = run_cli([*PROGRAM, "--init_from=hf:base", "--job_log_dir=job",
                     "--fdl.train.steps=4"])
  assert resumed.code == 2, resumed.stderr
  assert resumed.stderr.count("\n") == 1 and (
      "lingvo_lite: error: train.init_from=hf:base: gives frozen weights sha256:" in
      resumed.stderr and f"but step 2 in {tmp_path}/job/checkpoints was trained over "
      f"{recorded}; give the base it was trained on" in resumed.stderr), resumed.stderr
  assert tree_digest(tmp_path / "job") == before


def dpo_config() -> fdl.Config:
  """QLoRA with DPO on the preference store the test builds (its folder in $LK45_DATA)."""
  data = os.environ["LK45_DATA"]
  task = fdl.Config(preference_task, files={"train": f"{data}/train.jsonl"},
                    vocabulary=fdl.Config(PretrainedTokenizer, path=f"{data}/tok"))
  stream = lambda split, **more: fdl.Config(PreferenceStoreData, task=task, split=split,
                                            store_dir=f"{data}/stores/{split}",
                                            sequence_length=256, global_batch_size=2, **more)
  return setup_config(
      model=fdl.Config(Llama, vocab_size=272, num_layers=2, dim=32, num_heads=4,
                       num_kv_heads=2, mlp_dim=48, max_length=256,
                       quantization="int8_weights"),
      optimizer=fdl.Config(AdamW, peak_learning_rate=1e-2, warmup_steps=0),
      # The eval reads the train pairs: a second store would cost its build, and tests nothing
      # the first does not.
      train_data=stream("train"), eval_data=stream("train", shuffle=False),
      train=fdl.Config(TrainLoop, steps=2, log_every_steps=1,
                       objective=fdl.Config(Dpo, beta=0.5),
                       lora=fdl.Config(lora.LoraSettings, rank=2)),
      checkpoint=fdl.Config(CheckpointSettings, every_steps=2))


def test_qlora_dpo_on_preference_pairs_reports_its_rewards(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("LK45_DATA", str(tmp_path / "data"))
  chat_tokenizers.byte_level_folder(tmp_path / "data" / "tok")
  (tmp_path / "data" / "train.jsonl").write_text("".join(
      json.dumps({"prompt": f"{i}+{i}=", "chosen": str(2 * i), "rejected": str(2 * i + 1)})
      + "\n" for i in range(6)))
  trained = run_cli(["--fdl_config=tests.programs.test_post_training.dpo_config",
                     "--job_log_dir=job"])
  assert trained.code == 0, trained.stderr
  rows = [json.loads(line) for line in open("job/metrics.jsonl")]
  assert abs(rows[0]["loss"] - np.log(2.0)) < 1e-4  # The policy starts as its reference.
  assert {"reward_margin", "reward_accuracy", "reward_chosen", "pairs"} <= set(rows[-1])
  evaluated = [json.loads(line) for line in open("job/eval_validation.jsonl")][-1]
  assert evaluated["pairs"] == 6 and 0 <= evaluated["reward_accuracy"] <= 1
  assert "final eval loss:  DPO loss" in trained.stdout
  report = run_cli(["--mode=report", "--job_log_dir=job"])
  assert report.code == 0, report.stderr
  page = open("job/report/index.html", encoding="utf-8").read()
  assert "DPO reward margin" in page and "DPO reward accuracy" in page


def test_the_memory_verdict_counts_adapters_a_frozen_base_and_a_reference():
  """Shapes only: LoRA trains (and keeps moments for) its adapters alone, over a frozen base;
  QLoRA's base is int8 with a float32 scale per output channel; full DPO adds a copy."""
  cfg = setup_config(
      model=fdl.Config(Llama, vocab_size=512, num_layers=2, dim=64, num_heads=4, mlp_dim=128),
      optimizer=fdl.Config(AdamW),
      train_data=fdl.Config(SyntheticData, vocab_size=512, sequence_length=16,
                            global_batch_size=2),
      train=fdl.Config(TrainLoop, lora=fdl.Config(lora.LoraSettings, rank=4)))
  full_params = 4 * fdl.build(cfg.model).num_parameters()
  lora_need = memory_fit.per_device_need(fdl.build(cfg), 1)
  # Per layer: q, k, v, o (64 in, 64 out) and gate, up (64 -> 128), down (128 -> 64).
  adapters = 2 * 4 * (4 * (64 + 64) + 2 * (64 + 128) + (128 + 64))
  assert (lora_need.parameters, lora_need.gradients) == (4 * adapters, 4 * adapters)
  assert lora_need.moments == 2 * 4 * adapters and lora_need.frozen == full_params
  cfg.model.quantization = "int8_weights"
  qlora = memory_fit.per_device_need(fdl.build(cfg), 1)
  matrices = 2 * (4 * 64 * 64 + 3 * 64 * 128) + 2 * 512 * 64  # Blocks, embedding, output.
  scales = 2 * (4 * 64 + 2 * 128 + 64) + 512 + 512  # One per output channel (row for tables).
  assert qlora.frozen == full_params - 4 * matrices + matrices + 4 * scales
  cfg.model.quantization = None
  cfg.train.lora = None
  cfg.train.objective = fdl.Config(Dpo)  # A full fine-tune: its reference is a copy.
  dpo = memory_fit.per_device_need(fdl.build(cfg), 1)
  assert (dpo.parameters, dpo.frozen, dpo.moments) == (full_params, full_params,
                                                       2 * full_params)
