"""Issue 51's "one row" claims: a throwaway part defined in this module, registered at run time,
runs through train, eval, decode, compile and HF export, and no project module names it.

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
import json

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.config import registry
from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import attention_kernels, family, format_names
from lingvo_lite.models.config_rows import NUMBER, Key
from lingvo_lite.models.llama import Llama, LlamaHfNames
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.testing import run_cli
from lingvo_lite.weights.hf_checkpoint import HfCheckpoint
from lingvo_lite.weights.job_checkpoint import JobCheckpoint

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
    decode=attention_kernels.DecodeForm(layout="heads", attend=_chunked_decode))

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
