"""Room for what comes next: a training objective is one module plus one row. Each test here
defines its new part in this module (registered at run time: the config points at it) and runs
it through the programs (train, eval, decode, compile, HF export) without touching a module of
the project."""

import dataclasses
import json
import math
import os
from typing import Any, ClassVar, Mapping

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from lingvo_lite import memory_fit
from lingvo_lite.checkpoints.manager import CheckpointSettings
from lingvo_lite.config import building, files as config_files
from lingvo_lite.data.synthetic import SyntheticData
from lingvo_lite.experiment import TrainLoop, setup_config
from lingvo_lite.models.llama import Llama
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.programs.compile import compiled_steps
from lingvo_lite.testing import run_cli
from lingvo_lite.training.objectives.objective import Forward, Objective, Plotted, token_losses
from lingvo_lite.training.optimizers import AdamW

# ----------------------------------------------------------------------------- an objective


@dataclasses.dataclass(frozen=True)
class LabelSmoothedLm(Objective):
  """The next-token loss against targets smoothed toward the uniform distribution: per
  weighted token, (1 - s) x cross-entropy + s x the mean over the vocabulary of -log p.
  Logs the plain cross-entropy as `nll` beside it, and holds twice one pass's logits beside
  the policy's (what its memory claims, for the compile verdict to count)."""

  smoothing: float = 0.2

  eval_columns: ClassVar[tuple[tuple[str, str], ...]] = (("loss", "loss"), ("nll", "nll"))
  plots: ClassVar[tuple[Plotted, ...]] = (Plotted("nll", "Label-smoothed run's NLL", "nats"),)

  def _sums(self, forward: Forward, params: Any, batch: Any) -> dict[str, jax.Array]:
    logits = forward.logits(params, batch)
    cross_entropy, log_z, _ = token_losses(logits, batch["targets"])
    uniform = log_z - jnp.mean(logits.astype(jnp.float32), axis=-1)
    smoothed = (1.0 - self.smoothing) * cross_entropy + self.smoothing * uniform
    weights = batch["weights"]
    return {"smoothed_sum": jnp.sum(smoothed * weights),
            "nll_sum": jnp.sum(cross_entropy * weights), "weight_sum": jnp.sum(weights)}

  def loss(self, forward, params, batch, normalizer, z_loss=0.0):
    sums = self._sums(forward, params, batch)
    return sums["smoothed_sum"] / normalizer, sums

  def train_metrics(self, sums, normalizer, batch):
    return {"loss": sums["smoothed_sum"] / normalizer, "nll": sums["nll_sum"] / normalizer,
            "tokens": normalizer}

  def eval_sums(self, forward, params, batch, per_token=False):
    return self._sums(forward, params, batch)

  def eval_metrics(self, totals: Mapping[str, float], text_bytes):
    weight = totals["weight_sum"]
    return {"loss": totals["smoothed_sum"] / weight if weight else math.nan,
            "nll": totals["nll_sum"] / weight if weight else math.nan, "tokens": weight}

  def step_bytes(self, logits_bytes: int) -> int:
    return 2 * logits_bytes


def objective_config() -> fdl.Config:
  """A tiny Llama trained with `LabelSmoothedLm` on synthetic tokens, two steps."""
  data = lambda seed, **more: fdl.Config(SyntheticData, vocab_size=64, sequence_length=16,
                                         global_batch_size=4, seed=seed, **more)
  return setup_config(
      model=fdl.Config(Llama, vocab_size=64, num_layers=1, dim=16, num_heads=2, num_kv_heads=1,
                       mlp_dim=32, max_length=32),
      optimizer=fdl.Config(AdamW, peak_learning_rate=1e-2, warmup_steps=0),
      train_data=data(0), eval_data=data(1, num_batches=1),
      train=fdl.Config(TrainLoop, steps=2, log_every_steps=1, peak_tflops_per_device=1.0,
                       objective=fdl.Config(LabelSmoothedLm, smoothing=0.25)),
      checkpoint=fdl.Config(CheckpointSettings, every_steps=2))


def _smoothed_loss(logits: np.ndarray, targets: np.ndarray, weights: np.ndarray,
                   smoothing: float) -> float:
  """The label-smoothed loss written out in NumPy (float64): the weighted mean over tokens of
  -sum_v q_v log p_v, with q = (1 - s) one_hot(target) + s / V."""
  logits = logits.astype(np.float64)
  log_p = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1,
                                 keepdims=True)) - logits.max(-1, keepdims=True)
  vocab = logits.shape[-1]
  q = smoothing / vocab * np.ones_like(log_p)
  np.put_along_axis(q, targets[..., None], (1 - smoothing) + smoothing / vocab, axis=-1)
  return float(np.sum(-np.sum(q * log_p, -1) * weights) / np.sum(weights))


def test_an_objective_defined_here_trains_evaluates_decodes_compiles_and_exports(
    tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  trained = run_cli(["--fdl_config=tests.test_one_row.objective_config", "--job_log_dir=job"])
  assert trained.code == 0, trained.stderr[-2000:]
  assert "final eval loss:  loss " in trained.stdout  # Its own summary line (the default).

  # The train step minimized its loss: step 1's is the formula on the first batch at init.
  setup = building.build(config_files.load(epath.Path("job/config.json")))
  assert setup.train.objective == LabelSmoothedLm(smoothing=0.25)
  jitted = JittedSteps(setup)
  with jitted.activated():
    params = jitted.init_state().params
  batch = setup.train_data.batch(0)
  logits = np.asarray(jax.jit(setup.model.apply)({"params": params}, batch["inputs"]))
  rows = [json.loads(line) for line in open("job/metrics.jsonl")]
  assert {"loss", "nll", "tokens"} <= set(rows[0]) and "accuracy" not in rows[0]
  np.testing.assert_allclose(rows[0]["loss"], _smoothed_loss(
      logits, batch["targets"], batch["weights"], 0.25), rtol=2e-5)
  np.testing.assert_allclose(rows[0]["nll"], _smoothed_loss(
      logits, batch["targets"], batch["weights"], 0.0), rtol=2e-5)  # Its own second metric.

  # Eval: its own sums and metrics, in the rows and the table.
  evaluated = run_cli(["--mode=eval", "--job_log_dir=job"])
  assert evaluated.code == 0, evaluated.stderr[-2000:]
  row = json.loads(open("job/eval/eval_validation.jsonl").read().splitlines()[-1])
  assert {"loss", "nll", "tokens"} <= set(row) and "perplexity" not in row
  assert " nll " in evaluated.stdout + evaluated.stderr

  # Decode and the HF export read its job as any other.
  open("prompts.jsonl", "w").write(json.dumps({"prompt_ids": [5, 6, 7], "max_new_tokens": 3,
                                               "temperature": 0}) + "\n")
  decoded = run_cli(["--mode=decode", "--job_log_dir=job", "--prompts_file=prompts.jsonl",
                     "--decode_out=-"])
  assert decoded.code == 0, decoded.stderr[-2000:]
  assert len(json.loads(decoded.stdout.splitlines()[0])["completion_ids"]) == 3
  exported = run_cli(["--mode=export", "--job_log_dir=job", "--export_format=hf",
                      "--export_dir=hf"])
  assert exported.code == 0, exported.stderr[-2000:]
  assert os.path.getsize("hf/model.safetensors") > 0

  # Compile: the verdict counts what the objective holds beside the policy's pass, and a saved
  # step records the objective it was compiled with.
  compiled = run_cli(["--mode=compile", "--job_log_dir=job", "--compile_topology=cpu:1"])
  assert compiled.code == 0, compiled.stderr[-2000:]
  assert compiled_steps.step_config(jitted)["train.objective"] == (
      "LabelSmoothedLm(smoothing=0.25)")
  logits_bytes = 4 * 4 * 16 * 64  # float32 [rows, length, vocab] of the train batch.
  plain = dataclasses.replace(setup, train=dataclasses.replace(
      setup.train, objective=Objective()))
  assert (memory_fit.per_device_need(setup, 1).batch
          - memory_fit.per_device_need(plain, 1).batch) == 2 * logits_bytes

  # The report draws the metric it declared.
  reported = run_cli(["--mode=report", "--job_log_dir=job"])
  assert reported.code == 0, reported.stderr[-2000:]
  assert "Label-smoothed run&#x27;s NLL" in open("job/report/index.html", encoding="utf-8").read()
