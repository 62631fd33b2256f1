"""Issue 51's "one row" claims: a throwaway part defined in this module, registered at run time,
runs through train, eval, decode, compile and HF export, and no project module names it.

The objective: the next-token loss against label-smoothed targets, with the plain
cross-entropy logged beside it; its first step's loss is checked against NumPy and the compile
verdict counts the memory it claims.

The attention kernel: queries in chunks of 16, each chunk's probabilities by jax.nn.softmax
over the key/value heads repeated per query head, in float32 (the einsum row's function by
another formula), with a decode form of its own over the cache of every head. It must give
the einsum row's losses, evaluation and greedy tokens, and it counts its traces, so the test
knows it ran rather than a fallback.

A model family: `ToyLlama`, a Llama with its own defaults, its own Hugging Face `model_type`
and one config row of its own (its norm's epsilon under another config.json key), registered
as a family and given its names by the public decorator (`format_names.names_for`). It trains,
evaluates, decodes, compiles for the CPU and exports as a Hugging Face folder that reads back
as the same model with the same weights, all in this process.
"""

import collections
import dataclasses
import json
import math
import os
from typing import Any, ClassVar, Mapping

from etils import epath
import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite import memory_fit
from lingvo_lite.checkpoints.manager import CheckpointSettings
from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.config import building, files as config_files, registry
from lingvo_lite.data.synthetic import SyntheticData
from lingvo_lite.experiment import TrainLoop, setup_config
from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import attention_kernels, family, format_names
from lingvo_lite.models.config_rows import NUMBER, Key
from lingvo_lite.models.llama import Llama, LlamaHfNames
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.programs.compile import compiled_steps
from lingvo_lite.testing import run_cli
from lingvo_lite.training.objectives.objective import Forward, Objective, Plotted, token_losses
from lingvo_lite.training.optimizers import AdamW
from lingvo_lite.weights.hf_checkpoint import HfCheckpoint
from lingvo_lite.weights.job_checkpoint import JobCheckpoint

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


# ------------------------------------------------------------------ an attention kernel


_KERNEL = "chunked_queries"
_CHUNK = 16
_CALLS = collections.Counter()


def _chunked_attend(layer, q, k, v, segment_ids, sinks=None):
  """Training's and prefill's attention, a chunk of queries at a time."""
  del sinks  # Not in the row's masks: a call with sinks goes to the einsum row.
  _CALLS["train"] += 1
  length, group = q.shape[1], q.shape[2] // k.shape[2]
  k, v = (jnp.repeat(a, group, axis=2).astype(jnp.float32) for a in (k, v))
  keys_at, window, chunks = jnp.arange(length), layer.sliding_window(), []
  for start in range(0, length, _CHUNK):
    rows = keys_at[start:start + _CHUNK]
    seen = rows[:, None] >= keys_at[None, :]
    if window is not None:
      seen &= rows[:, None] - keys_at[None, :] < window
    seen = seen[None, None]
    if segment_ids is not None:
      seen = seen & (segment_ids[:, None, start:start + _CHUNK, None]
                     == segment_ids[:, None, None, :])
    logits = jnp.einsum("bchd,bshd->bhcs", q[:, start:start + _CHUNK].astype(jnp.float32),
                        k) * layer.scale()
    probabilities = jax.nn.softmax(jnp.where(seen, logits, -jnp.inf), axis=-1)
    chunks.append(jnp.einsum("bhcs,bshd->bchd", probabilities, v))
  return jnp.concatenate(chunks, axis=1).astype(layer.dtype)


def _chunked_decode(step):
  """A decode step over the cache of every key/value head: the entries the layer's hook lets
  each query see, by jax.nn.softmax."""
  _CALLS["decode"] += 1
  layer, (keys, values) = step.layer, step.cache
  seen = layer._cache_mask(step.positions, keys.shape[-2])  # pylint: disable=protected-access
  logits = jnp.einsum("btkgd,bked->btkge", step.q.astype(jnp.float32),
                      keys.astype(jnp.float32))
  probabilities = jax.nn.softmax(jnp.where(seen[:, :, None, None], logits, -jnp.inf), axis=-1)
  out = jnp.einsum("btkge,bked->btkgd", probabilities, values.astype(jnp.float32))
  batch, length = step.q.shape[:2]
  return out.reshape(batch, length, layer.num_heads, layer.head_dim).astype(layer.dtype)


_ROW = attention_kernels.Kernel(
    name=_KERNEL, description="a test's chunked-query attention", platforms=("cpu",),
    masks=frozenset({"segments", "window"}), attend=_chunked_attend,
    decode=attention_kernels.DecodeForm(layouts=("heads",), attend=_chunked_decode))

_TRAIN = ["--exp=PyCodeLlamaTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
          "--fdl.train.steps=2", "--fdl.train.log_every_steps=1",
          "--fdl.train.eval_every_steps=2", "--fdl.checkpoint.every_steps=2"]
_PROMPTS = ('{"prompt_ids": [5, 17, 42, 3]}\n'
            '{"prompt_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]}\n')


def _rows(path, key):
  return [json.loads(line)[key] for line in path.read_text().splitlines()
          if key in json.loads(line)]


def _ran(result, where):
  assert result.code == 0, (where, result.stderr[-3000:])
  return result


def test_an_attention_kernel_is_one_row(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "prompts.jsonl").write_text(_PROMPTS)
  decode = ["--mode=decode", "--prompts_file=prompts.jsonl", "--fdl.decode.max_new_tokens=6"]
  with attention_kernels.registered(_ROW):
    _ran(run_cli([*_TRAIN, "--job_log_dir=einsum",
                  "--fdl.model.attention_implementation='einsum'"]), "train einsum")
    assert not _CALLS
    ours = _ran(run_cli([*_TRAIN, "--job_log_dir=ours",
                         f"--fdl.model.attention_implementation='{_KERNEL}'"]), "train")
    assert _CALLS["train"] and f"blocks: attention {_KERNEL}, remat" in ours.stdout + ours.stderr
    np.testing.assert_allclose(_rows(tmp_path / "ours/metrics.jsonl", "loss"),
                               _rows(tmp_path / "einsum/metrics.jsonl", "loss"), rtol=1e-5)
    traced = _CALLS["train"]
    _ran(run_cli(["--mode=eval", "--job_log_dir=ours"]), "eval")
    assert _CALLS["train"] > traced
    (evaluated,) = (tmp_path / "ours/eval").glob("eval_*.jsonl")
    np.testing.assert_allclose(_rows(evaluated, "eval_loss"),
                               _rows(tmp_path / "einsum" / evaluated.name, "eval_loss"),
                               rtol=1e-5)
    _ran(run_cli([*decode, "--job_log_dir=ours", "--decode_out=ours.jsonl"]), "decode")
    _ran(run_cli([*decode, "--job_log_dir=ours", "--decode_out=einsum.jsonl",
                  "--fdl.model.attention_implementation='einsum'"]), "decode einsum")
    assert _CALLS["decode"]
    assert (_rows(tmp_path / "ours.jsonl", "completion_ids")
            == _rows(tmp_path / "einsum.jsonl", "completion_ids"))
    np.testing.assert_allclose(sum(_rows(tmp_path / "ours.jsonl", "logprobs"), []),
                               sum(_rows(tmp_path / "einsum.jsonl", "logprobs"), []),
                               rtol=1e-5, atol=1e-6)
    traced = _CALLS["train"]
    _ran(run_cli(["--mode=compile", "--job_log_dir=ours", "--compile_topology=cpu:1"]),
         "compile")
    assert _CALLS["train"] > traced
    _ran(run_cli(["--mode=export", "--job_log_dir=ours", "--export_dir=hf"]), "export")
    assert (tmp_path / "hf/config.json").is_file()
  # Out of the table, the name is no value of the field.
  gone = run_cli([*_TRAIN, "--job_log_dir=gone",
                  f"--fdl.model.attention_implementation='{_KERNEL}'"])
  choices = ", ".join(map(repr, ("auto", *attention_kernels.KERNELS)))
  assert gone.code == 2 and f"must be one of {choices}, got" in gone.stderr, gone.stderr


# ------------------------------------------------------------------ a model family

TOY = "lingvo_lite_toy"
# Small enough that each program's compile takes about a second on one CPU (set after the
# tiny fiddler, which would set its own).
TOY_SIZES = dict(num_layers=2, dim=32, num_heads=4, num_kv_heads=2, mlp_dim=64, max_length=64)
# Its one row of its own: the norm's epsilon is `toy_norm_eps`, not Llama's `rms_norm_eps`
# (its default the family's own; the job trains with another, which the export must say).
TOY_EPS, TRAINED_EPS = 3e-5, 4e-5


class ToyLlama(Llama):
  """A Llama whose norm's epsilon defaults to `TOY_EPS` (registered by `toy_family`)."""

  norm_eps: PositiveFloat = TOY_EPS
  same_model_as = ()


class ToyHfNames(LlamaHfNames):
  """Llama's Hugging Face names with its own model type and one row changed."""

  model_type = TOY
  architecture = "ToyLlamaForCausalLM"
  config_rows = LlamaHfNames.config_rows.changed(
      Key("norm_eps", "toy_norm_eps", None, TOY_EPS, NUMBER), drop=("rms_norm_eps",))


def toy_config() -> fdl.Config:
  """PyCodeTiny's setup with the toy family as its model (`--fdl_config` takes this)."""
  cfg = registry.lookup("PyCodeTiny").config()
  cfg.model = fdl.Config(ToyLlama, vocab_size=cfg.model.vocab_size, **TOY_SIZES)
  return cfg


@pytest.fixture
def registered_toy(monkeypatch):
  """The family and its Hugging Face names registered for this test only (the names class
  stays registered for `ToyLlama`, which no other test's family list holds)."""
  monkeypatch.setattr(ToyLlama, "family_name", TOY)
  monkeypatch.setitem(family.FAMILIES, TOY, ToyLlama)
  format_names.names_for(ToyLlama)(ToyHfNames)


def _flat(tree, prefix=()) -> dict[str, np.ndarray]:
  if not isinstance(tree, dict):
    return {"/".join(prefix): np.asarray(tree)}
  return {name: leaf for key, value in tree.items()
          for name, leaf in _flat(value, prefix + (key,)).items()}


@pytest.mark.usefixtures("registered_toy")
def test_a_family_defined_here_trains_evaluates_decodes_compiles_and_exports(tmp_path,
                                                                             monkeypatch):
  monkeypatch.chdir(tmp_path)
  train = run_cli(["--mode=train", f"--fdl_config={__name__}.toy_config", "--job_log_dir=job",
                   "--fiddler=tiny", "--fiddler=synthetic_data",
                   *(f"--fdl.model.{name}={value}" for name, value in TOY_SIZES.items()),
                   f"--fdl.model.norm_eps={TRAINED_EPS}", "--fdl.train.steps=2",
                   "--fdl.checkpoint.every_steps=2", "--fdl.eval_data.num_batches=1"])
  assert train.code == 0, train.stderr[-3000:]
  (tmp_path / "prompts.jsonl").write_text('{"prompt_ids": [5, 6, 7]}\n')  # Synthetic ids.
  for args in (["--mode=eval"],
               ["--mode=decode", "--prompts_file=prompts.jsonl", "--decode_out=decoded.jsonl",
                "--fdl.decode.max_new_tokens=4"],
               ["--mode=compile", "--compile_topology=cpu:1"]):
    result = run_cli([*args, "--job_log_dir=job"])
    assert result.code == 0, (args, result.stderr[-3000:])
  decoded = json.loads((tmp_path / "decoded.jsonl").read_text().splitlines()[0])
  assert 1 <= len(decoded["completion_ids"]) <= 4, decoded

  exported = run_cli(["--mode=export", "--job_log_dir=job", "--export_dir=out"])
  assert exported.code == 0, exported.stderr[-3000:]
  config = json.loads((tmp_path / "out" / "config.json").read_text())
  assert config["model_type"] == TOY and config["toy_norm_eps"] == TRAINED_EPS
  assert "rms_norm_eps" not in config

  # Read back: the same family and fields, and the job's own weights, value for value.
  source = HfCheckpoint(str(tmp_path / "out"))
  read_family, fields = source.model_fields()
  assert read_family is ToyLlama
  assert {name: fields[name] for name in TOY_SIZES} == TOY_SIZES
  assert fields["norm_eps"] == TRAINED_EPS
  model = ToyLlama(**fields)
  shapes = MeshParams(model, 16, Partitioner(), Partitioner().make_mesh())
  theirs, _ = source.load_params(shapes)
  ours, _ = JobCheckpoint("job").load_params(shapes)
  theirs, ours = _flat(theirs), _flat(ours)
  assert theirs.keys() == ours.keys()
  for name, values in ours.items():
    np.testing.assert_array_equal(theirs[name], values, err_msg=name)
