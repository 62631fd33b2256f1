"""config.json reloads to an equal config; config.txt lists every field; resume checks;
--fdl_help's listing."""

import copy
import errno

import fiddle as fdl
import pytest
from etils import epath

from lingvo_lite.config import files as config_files, help as config_help, overrides, registry
from lingvo_lite.runtime import small_disk
from lingvo_lite.testing import override_directives, run_cli, tiny_config


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


# ----------------------------------------------------------------------------- containers


def _two_sets(*keys):
  """The synthetic tiny config with eval_data a dict of sets named `keys`."""
  cfg = tiny_config("PyCodeTiny", synthetic=True)
  cfg.eval_data = {key: copy.deepcopy(cfg.eval_data) for key in keys or ("validation",
                                                                          "held_out")}
  return cfg


def _lines(text):
  """config.txt's lines as (assignment, origin), the padding between them dropped."""
  return [tuple(part.strip() for part in line.split("  # ", 1)) for line in text.splitlines()]


def test_config_text_lists_each_entry_of_a_dict_under_its_path():
  cfg = _two_sets("validation", "held_out", "held out")
  overrides.apply(cfg, override_directives(["--fdl.eval_data['held_out'].num_batches=8"]), None)
  lines = _lines(config_files.to_text(cfg))
  assignments = [line[0] for line in lines]
  start = assignments.index("eval_data = {validation, held_out, 'held out'}")
  assert assignments[start + 1:start + 3] == [
      "eval_data.validation = <lingvo_lite.data.synthetic.SyntheticData>",
      "eval_data.validation.vocab_size = 259"]
  assert ("eval_data.held_out.num_batches = 8",
          "command line: --fdl.eval_data['held_out'].num_batches=8") in lines
  assert "eval_data['held out'].num_batches = 2" in assignments
  # An entry's own line says where the dict was set.
  entry = next(line for line in lines if line[0].startswith("eval_data.held_out = "))
  assert entry[1] == next(line for line in lines if line[0].startswith("eval_data = "))[1]
  assert entry[1].startswith("tests/config/test_config_files.py:")


def test_config_text_lists_the_configs_in_a_list_and_keeps_literal_containers_whole():
  assignments = [line[0] for line in _lines(config_files.to_text(
      registry.lookup("PyCodeMixtureTiny").config()))]
  assert "train_data.sources = <list of 2 items>" in assignments
  assert "train_data.sources[1] = <lingvo_lite.data.store_data.StoreStream>" in assignments
  assert "train_data.sources[1].split = 'train'" in assignments
  assert "train_data.rates = [0.8, 0.2]" in assignments


def test_a_dict_of_configs_round_trips_with_the_origins_of_its_entries(tmp_path):
  cfg = _two_sets("validation", "held_out", "held out")
  overrides.apply(cfg, override_directives(["--fdl.eval_data.held_out.num_batches=8"]), None)
  config_files.write(epath.Path(tmp_path), cfg)
  reloaded = config_files.load(epath.Path(tmp_path) / config_files.CONFIG_JSON)
  assert reloaded == cfg
  assert list(reloaded.eval_data) == ["validation", "held_out", "held out"]
  assert fdl.build(reloaded.eval_data) == fdl.build(cfg.eval_data)
  assert config_files.to_text(reloaded) == config_files.to_text(cfg)
  assert ("eval_data.held_out.num_batches = 8",
          "command line: --fdl.eval_data.held_out.num_batches=8") in _lines(
              config_files.to_text(reloaded))


def test_eval_sets_may_change_on_resume_but_the_model_may_not():
  old = _two_sets()
  new = _two_sets()
  new.eval_data["held_out"].num_batches = 9
  assert config_files.incompatible_changes(old, new) == []
  new.eval_data["extra"] = copy.deepcopy(new.eval_data["held_out"])  # A set added ...
  del new.eval_data["validation"]  # ... and one removed.
  assert config_files.incompatible_changes(old, new) == []
  assert config_files.incompatible_changes(old, tiny_config("PyCodeTiny", synthetic=True)) == []
  new.model.dim = 128
  assert config_files.incompatible_changes(old, new) == ["model.dim: 64 -> 128"]


def test_fdl_help_lists_the_fields_of_each_entry_under_its_path():
  cfg = _two_sets("validation", "held out")
  overrides.apply(cfg, override_directives(["--fdl.eval_data.validation.seed=5"]), None)
  lines = config_help.describe(cfg, {}).splitlines()
  entry = next(i for i, line in enumerate(lines) if line.startswith("  eval_data.validation:"))
  assert lines[entry].startswith(
      "  eval_data.validation: DataSource = <lingvo_lite.data.synthetic.SyntheticData>    # ")
  assert ("  eval_data.validation.seed: int = 5    # command line: "
          "--fdl.eval_data.validation.seed=5") in lines
  doc = lines.index("  eval_data['held out'].period: int = 16    # default") + 1
  assert lines[doc].startswith("      Length of the repeated motif")  # SyntheticData's docstring.
  assert any(line.startswith("  eval_data: ") and line.split(" = ", 1)[1].startswith(
      "{validation, 'held out'}    # ") for line in lines)


def test_a_config_written_before_a_part_existed_takes_overrides_of_that_part(tmp_path):
  """An older job's config.json has no `decode` part: the executor gives it the default
  Config, so `--fdl.decode.*` reaches a field instead of failing on a frozen instance."""
  cfg = tiny_config("PyCodeTiny", synthetic=True)
  del cfg.decode
  config_files.write(epath.Path(tmp_path), cfg)
  result = run_cli(["--mode=print", f"--fdl_config_file={tmp_path}/config.json",
                    "--fdl.decode.slots=2", "--fdl.decode.top_p=0.5"])
  assert result.code == 0, result.stderr
  assert "decode.slots = 2" in result.stdout and "decode.top_p = 0.5" in result.stdout


def test_on_a_full_disk_a_failed_rewrite_names_the_file_and_leaves_it_and_no_temporary(
    tmp_path):
  disk = small_disk.for_test(tmp_path / "disk", "1m")
  with disk:
    job = epath.Path(disk.path) / "job"
    cfg = registry.lookup("PyCodeTiny").config()
    config_files.write(job, cfg)
    before = {p.name: p.read_bytes() for p in job.iterdir()}
    cfg.train.steps = 7  # A resumed run's new config, rewritten at its first commit.
    disk.fill()
    with pytest.raises(OSError) as failure:
      config_files.write(job, cfg)
    assert failure.value.errno == errno.ENOSPC
    assert failure.value.filename == str(job / config_files.CONFIG_JSON)  # Not a temporary.
    assert {p.name: p.read_bytes() for p in job.iterdir()} == before


@pytest.mark.parametrize("experiment, tied", [("Gpt2Small", True), ("GptJ6B", False)])
def test_a_config_json_from_before_the_model_defaults_changed_keeps_them(tmp_path, capsys,
                                                                         experiment, tied):
  """A file without today's format mark was written when embedding rows had unit scale and a
  tied output was divided by sqrt(dim): its model gets those, explicitly (an untied model
  only the first), and the run says so once; today's files keep today's defaults."""
  import json  # pylint: disable=import-outside-toplevel
  cfg = registry.lookup(experiment).config()
  assert "tied_output_scale" not in cfg.model.__arguments__
  path = epath.Path(tmp_path) / "config.json"
  path.write_text(config_files.to_json(cfg))
  today = config_files.load(path)
  assert (today.model.__arguments__.get("tied_output_scale"),
          today.model.__arguments__.get("embedding_init_stddev")) == (None, None)
  assert capsys.readouterr().err == ""
  data = json.loads(path.read_text())
  del data["lingvo_lite"]["format"]
  path.write_text(json.dumps(data))
  older = config_files.load(path)
  expected = {"embedding_init_stddev": 1.0}
  if tied:
    expected["tied_output_scale"] = "rsqrt_dim"
  assert {name: older.model.__arguments__.get(name)
          for name in ("embedding_init_stddev", "tied_output_scale")} == {
              "embedding_init_stddev": 1.0,
              "tied_output_scale": "rsqrt_dim" if tied else None}
  note = capsys.readouterr().err
  assert note.count("\n") == 1 and "written before some model defaults changed" in note
  assert all(f"model.{name}={value!r}" in note for name, value in expected.items()), note
  config_files.load(path)
  assert capsys.readouterr().err == ""  # Said once per file.
  # Today's config differs from the older file's where the function would (a tied output's
  # scale), and not for the initialization, which only a fresh start uses.
  changes = config_files.incompatible_changes(older, cfg)
  assert changes == (["model.tied_output_scale: 'rsqrt_dim' -> 'one'"] if tied else [])
