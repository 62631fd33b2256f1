"""Adding to the house is one row (issue 51), shown by additions that live in this module alone
and are registered at run time: nothing in lingvo_lite/ names them.

A model family: `ToyLlama`, a Llama with its own defaults, its own Hugging Face `model_type`
and one config row of its own (its norm's epsilon under another config.json key), registered
as a family and given its names by the public decorator (`format_names.names_for`). It trains,
evaluates, decodes, compiles for the CPU and exports as a Hugging Face folder that reads back
as the same model with the same weights, all in this process.
"""

import json

import fiddle as fdl
import numpy as np
import pytest

from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.config import registry
from lingvo_lite.fields import PositiveFloat
from lingvo_lite.models import family, format_names
from lingvo_lite.models.config_rows import NUMBER, Key
from lingvo_lite.models.llama import Llama, LlamaHfNames
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.testing import run_cli
from lingvo_lite.weights.hf_checkpoint import HfCheckpoint
from lingvo_lite.weights.job_checkpoint import JobCheckpoint

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
