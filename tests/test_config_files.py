"""config.json reloads to an equal config; config.txt lists every field; resume checks."""

import pytest
from etils import epath

from lingvo_lite import config_files, overrides, registry
from lingvo_lite.testing import override_directives


@pytest.mark.parametrize("name", sorted(registry.all_experiments()))
def test_config_json_round_trips(name, tmp_path):
  cfg = registry.lookup(name).config()
  config_files.write(epath.Path(tmp_path), cfg)
  reloaded = config_files.load(epath.Path(tmp_path) / config_files.CONFIG_JSON)
  assert reloaded == cfg
  assert config_files.to_text(reloaded).splitlines()[0] == "<root> = <lingvo_lite.experiment.Setup>"


def test_config_text_lists_defaults_and_nested_fields():
  text = config_files.to_text(registry.lookup("PyCodeTiny").config())
  assert "model.num_layers = 4" in text
  assert "train_data.task.source_dir = None" in text
  assert "checkpoint.async_save = True" in text and "model.parent" not in text


def test_incompatible_changes_ignore_loop_and_mesh_settings():
  old = registry.lookup("PyCodeTiny").config()
  new = registry.lookup("PyCodeTiny").config()
  new.train.steps = 5000
  new.partitioner.ici_fsdp = 2
  new.checkpoint.every_steps = 7
  assert config_files.incompatible_changes(old, new) == []
  new.optimizer.b2 = 0.99  # Optimizer hyperparameters may change on resume.
  new.optimizer.peak_learning_rate = 1e-5
  assert config_files.incompatible_changes(old, new) == []
  new.model.dim = 256
  new.train_data.seed = 7
  assert config_files.incompatible_changes(old, new) == [
      "model.dim: 128 -> 256", "train_data.seed: 0 -> 7"]


def test_a_reloaded_config_keeps_every_fields_origin(tmp_path):
  cls = registry.lookup("PyCodeTiny")
  cfg = cls.config()
  overrides.apply(cfg, override_directives(["--fiddler=tiny", "--fdl.train.steps=42"]), cls)
  config_files.write(epath.Path(tmp_path), cfg, cls)
  path = epath.Path(tmp_path) / config_files.CONFIG_JSON
  reloaded = config_files.load(path)
  assert config_files.to_text(reloaded) == config_files.to_text(cfg)
  text = config_files.to_text(reloaded)
  assert "# command line: --fdl.train.steps=42" in text
  assert "# experiments/lm/pycode.py:" in text and "# default" in text
  assert config_files.recorded_experiment(path) == "experiments.lm.pycode.PyCodeTiny"


def test_a_config_json_without_origins_still_loads(tmp_path):
  """Files written before origins were recorded (Fiddle's JSON alone) load, as `default`."""
  from fiddle.experimental import serialization  # pylint: disable=g-import-not-at-top
  cfg = registry.lookup("PyCodeTiny").config()
  (tmp_path / "config.json").write_text(serialization.dump_json(cfg))
  reloaded = config_files.load(epath.Path(tmp_path) / "config.json")
  assert reloaded == cfg
  assert config_files.recorded_experiment(epath.Path(tmp_path) / "config.json") is None
