"""Command-line overrides: order, literal parsing, type checks, history labels."""

import pytest

from lingvo_lite import config_files, overrides, registry
from lingvo_lite.errors import UsageError


def _apply(*args, experiment="PyCodeTiny"):
  cls = registry.lookup(experiment)
  cfg = cls.config()
  _, directives = overrides.extract(["prog", *args])
  overrides.apply(cfg, directives, cls)
  return cfg


def test_directives_apply_in_command_line_order():
  assert _apply("--fiddler=tiny", "--fdl.model.num_layers=3").model.num_layers == 3
  assert _apply("--fdl.model.num_layers=3", "--fiddler=tiny").model.num_layers == 2
  assert _apply("--fdl_set=model.num_layers=5", "--fiddler", "tiny",
                "--fdl_set", "model.num_layers=7").model.num_layers == 7


def test_extract_keeps_other_flags_for_absl():
  remaining, directives = overrides.extract(
      ["prog", "--mode=train", "--fdl.train.steps=4", "--fiddler", "tiny", "--job_log_dir=x"])
  assert remaining == ["prog", "--mode=train", "--fiddler", "tiny", "--job_log_dir=x"]
  assert [d.flag for d in directives] == ["--fdl.train.steps=4", "--fiddler=tiny"]


@pytest.mark.parametrize("value, expected", [
    ("1e-3", 1e-3), ("5", 5), ("None", None), ("True", True), ("'bfloat16'", "bfloat16"),
])
def test_values_are_python_literals(value, expected):
  fields = {1e-3: "optimizer.peak_learning_rate", 5: "optimizer.peak_learning_rate",
            None: "optimizer.clip_grad_norm", True: "checkpoint.async_save",
            "bfloat16": "model.dtype"}
  path = fields[expected]
  cfg = _apply(f"--fdl.{path}={value}")
  section, name = path.split(".")
  assert getattr(getattr(cfg, section), name) == expected


@pytest.mark.parametrize("arg, message", [
    ("--fdl.model.norm=rmsnorm",
     "not a Python literal.*--fdl.model.norm='\"rmsnorm\"'"),
    ("--fdl.model.norm='rms'", "model.norm must be one of 'layernorm', 'rmsnorm', got str"),
    ("--fdl.model.num_layers='two'", "model.num_layers must be int, got str 'two'"),
    ("--fdl.train.steps=1.5", "train.steps must be int, got float 1.5"),
    ("--fdl.model.num_layer=2", "has no field model.num_layer; did you mean 'num_layers'"),
    ("--fdl.train.steps.x=1", "train.steps is a int, not a config"),
    ("--fdl.nothing=1", "has no field nothing"),
    ("--fdl.model.num_layers", "expected PATH=VALUE"),
    ("--fdl.model.num_layers=__import__('os')", "not a Python literal"),
    ("--fiddler=tinyy", "no fiddler named 'tinyy'; valid choices: .*tiny"),
])
def test_bad_overrides_name_the_flag_and_the_fix(arg, message):
  with pytest.raises(UsageError, match=message):
    _apply(arg)


def test_path_through_none_is_reported():
  with pytest.raises(UsageError, match="eval_data is None"):
    _apply("--fiddler=no_eval", "--fdl.eval_data.num_batches=2")


def test_history_names_the_flag_that_set_each_field():
  text = config_files.to_text(_apply("--fiddler=tiny", "--fdl.train.steps=42"))
  assert "train.steps = 42" in text
  line = next(l for l in text.splitlines() if l.startswith("train.steps ="))
  assert line.endswith("# command line: --fdl.train.steps=42")
  line = next(l for l in text.splitlines() if l.startswith("model.dim ="))
  assert line.endswith("# command line: --fiddler=tiny")
  line = next(l for l in text.splitlines() if l.startswith("optimizer.b1 ="))
  assert line.endswith("# default")


def test_fiddlers_defined_on_the_experiment_win(monkeypatch):
  cls = registry.lookup("PyCodeTiny")
  monkeypatch.setattr(cls, "tiny", staticmethod(lambda cfg: setattr(cfg.train, "steps", 3)),
                      raising=False)
  assert _apply("--fiddler=tiny").train.steps == 3
