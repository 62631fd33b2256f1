"""Command-line overrides: order, literal parsing, type checks, history labels, paths into
dict entries and list elements."""

import copy
import dataclasses

import fiddle as fdl
import pytest

from lingvo_lite.config import files as config_files, overrides, registry
from lingvo_lite.errors import UsageError
from lingvo_lite.fields import PositiveInt
from lingvo_lite.testing import override_directives, run_cli, tiny_config


def _apply(*args, experiment="PyCodeTiny"):
  cls = registry.lookup(experiment)
  cfg = cls.config()
  overrides.apply(cfg, override_directives(args), cls)
  return cfg


def test_directives_apply_in_command_line_order():
  assert _apply("--fiddler=tiny", "--fdl.model.num_layers=3").model.num_layers == 3
  assert _apply("--fdl.model.num_layers=3", "--fiddler=tiny").model.num_layers == 2
  assert _apply("--fdl_set=model.num_layers=5", "--fiddler", "tiny",
                "--fdl_set", "model.num_layers=7").model.num_layers == 7


@pytest.mark.parametrize("args", [
    ["--fdl.train.steps=4", "--fiddler", "tiny", "--fdl_set", "model.dim=32"],
    ["--fdl.train.steps", "4", "-fiddler=tiny", "-fdl_set=model.dim=32"],
    ["-fdl.train.steps=4", "--fiddler=tiny", "--fdl_set=model.dim=32"],
])
def test_every_spelling_absl_accepts_is_an_override_in_order(args):
  directives = override_directives(["--mode=train", *args, "--job_log_dir=x"])
  assert [(d.kind, d.name or d.path) for d in directives] == [
      ("set", "train.steps"), ("fiddler", "tiny"), ("set", "model.dim")]
  assert [d.value_text for d in directives if d.kind == "set"] == ["4", "32"]


def test_overrides_in_a_flagfile_sit_at_its_position(tmp_path):
  flagfile = tmp_path / "flags.txt"
  flagfile.write_text("--fdl.model.num_layers=5\n--fiddler=tiny\n")
  directives = override_directives(["--fdl.model.dim=32", f"--flagfile={flagfile}",
                                    "--fdl.train.steps=3"])
  assert [d.flag for d in directives] == ["--fdl.model.dim=32", "--fdl.model.num_layers=5",
                                          "--fiddler=tiny", "--fdl.train.steps=3"]
  # Applied: the flagfile's fiddler comes after --fdl.model.num_layers=5, so it wins.
  cfg = registry.lookup("PyCodeTiny").config()
  overrides.apply(cfg, directives, None)
  assert (cfg.model.num_layers, cfg.model.dim, cfg.train.steps) == (2, 64, 3)


def test_arguments_after_double_dash_are_not_overrides():
  result = run_cli(["--mode=print", "--exp=PyCodeTiny", "--", "--fdl.model.dim=32"])
  assert result.code == 2 and "unexpected argument '--fdl.model.dim=32'" in result.stderr


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
    ("--fdl.model.norm='rms'",
     "model.norm must be one of 'layernorm', 'rmsnorm', 'rmsnorm_plus_one', got str"),
    ("--fdl.model.num_layers='two'", "model.num_layers must be int, got str 'two'"),
    ("--fdl.train.steps=1.5", "train.steps must be int, got float 1.5"),
    ("--fdl.model.num_layer=2", "has no field model.num_layer; did you mean 'num_layers'"),
    ("--fdl.train.steps.x=1", "train.steps is a int, not a config"),
    ("--fdl.nothing=1", "has no field nothing"),
    ("--fdl.model.num_layers=__import__('os')", "not a Python literal"),
    ("--fiddler=tinyy", "no fiddler named 'tinyy'; valid choices: .*tiny"),
    # What Python's parser or repr cannot take: one line, not a RecursionError or ValueError.
    ("--fdl.train.steps=" + "-" * 5000 + "1", "the value is not a Python literal"),
    ("--fdl.train.steps=" + "[" * 300 + "]" * 300, "the value is not a Python literal"),
    ("--fdl.model.norm={[1]: 2}", r"'\{\[1\]: 2\}' is not a Python literal"),
    ("--fdl.model.norm='" + "a" * 10_001 + "'",
     r"^--fdl.model.norm=\.\.\.: the value is 10003 characters long"),
    ("--fdl.model.norm=0x" + "f" * 4000, "got int <int of 16000 bits>$"),
    ("--fdl.model.norm='" + "a" * 300 + "'", "got str <str of 300 characters>$"),
    # Fiddlers by import path: only Python functions of the config, and not library ones.
    ("--fiddler=.x", "'.x' is neither a fiddler name nor a dotted import path"),
    ("--fiddler=sys.exit", "is a built-in function, not a fiddler"),
    ("--fiddler=builtins.input", "is a built-in function, not a fiddler"),
    ("--fiddler=shutil.rmtree", "shutil.rmtree is a Python standard library function, not a "
                                "fiddler"),
    ("--fiddler=lingvo_lite.executor.run_main", "is part of lingvo_lite itself, not a fiddler"),
    ("--fiddler=lingvo_lite.no_such_module.f", r"no fiddler named .*\(no module named "
                                               r"'lingvo_lite.no_such_module'\)"),
    ("--fiddler=tests.config.test_overrides.llt_two_arguments", r"llt_two_arguments\(cfg, other\) does "
                                                         "not take one argument"),
    ("--fiddler=tests.config.test_overrides.llt_raises", "^--fiddler=tests.config.test_overrides.llt_raises: "
     r"the fiddler raised RuntimeError: not for this config \(at .*test_overrides.py:\d+\)$"),
    ("--fiddler=tests.config.test_overrides.llt_exits", "the fiddler raised SystemExit: 0"),
])
def test_bad_overrides_name_the_flag_and_the_fix(arg, message):
  with pytest.raises(UsageError, match=message) as error:
    _apply(arg)
  assert "\n" not in str(error.value)


def llt_two_arguments(cfg, other):
  del cfg, other


def llt_raises(cfg):
  del cfg
  raise RuntimeError("not for this config")


def llt_exits(cfg):
  del cfg
  raise SystemExit(0)


def test_a_generic_fiddler_by_its_import_path_applies():
  assert _apply("--fiddler=lingvo_lite.config.fiddlers.tiny").model.num_layers == 2


@pytest.mark.parametrize("args, message", [
    (["--fdl.model.num_layers"], "--fdl.model.num_layers: missing value"),
    (["--fdl_set=model.num_layers"], "--fdl_set=model.num_layers: expected PATH=VALUE"),
    (["--fdl_set"], "Missing value for flag --fdl_set"),
    (["--flagfile=/no/such/flags.txt"], "/no/such/flags.txt"),
])
def test_malformed_overrides_are_one_line_usage_errors(args, message):
  result = run_cli(["--mode=print", "--exp=PyCodeTiny", *args])
  assert result.code == 2 and result.stderr.count("\n") == 1, result
  assert message in result.stderr


@pytest.mark.parametrize("outer", [None, "--fiddler=tiny\n--flagfile=latin1.txt\n"])
def test_a_flagfile_that_is_not_utf8_is_named(tmp_path, monkeypatch, outer):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "latin1.txt").write_bytes(b'--fdl.model.norm="caf\xe9"\n')
  if outer:
    (tmp_path / "outer.txt").write_text(outer)
  result = run_cli(["--mode=print", "--exp=PyCodeTiny",
                    f"--flagfile={'outer.txt' if outer else 'latin1.txt'}"])
  assert result.code == 2 and result.stderr.count("\n") == 1, result
  assert ("--flagfile=latin1.txt: not UTF-8 text (invalid continuation byte: byte b'\\xe9' at "
          "position 21); save it as UTF-8") in result.stderr


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


# ----------------------------------------------------------------------------- dict entries


def _two_sets(*keys):
  """The synthetic tiny config with eval_data a dict of two sets (or of `keys`)."""
  cfg = tiny_config("PyCodeTiny", synthetic=True)
  keys = keys or ("validation", "held_out")
  cfg.eval_data = {key: copy.deepcopy(cfg.eval_data) for key in keys}
  return cfg


def _set(cfg, *args):
  overrides.apply(cfg, override_directives(args), None)
  return cfg


@pytest.mark.parametrize("arg", [
    "--fdl.eval_data.held_out.num_batches=8",
    "--fdl.eval_data['held_out'].num_batches=8",
    '--fdl.eval_data["held_out"].num_batches=8',
    "--fdl_set=eval_data.held_out.num_batches=8",
    "--fdl_set=eval_data['held_out'].num_batches=8",
    "--fdl.eval_data[held_out].num_batches=8",  # What a shell passes on for ['held_out'].
])
def test_every_spelling_of_a_dict_entry_reaches_it(arg):
  cfg = _set(_two_sets(), arg)
  assert cfg.eval_data["held_out"].num_batches == 8
  assert cfg.eval_data["validation"].num_batches == 2
  line = next(l for l in config_files.to_text(cfg).splitlines()
              if l.startswith("eval_data.held_out.num_batches ="))
  assert line.startswith("eval_data.held_out.num_batches = 8 ")
  assert line.endswith(f"# command line: {arg}")


def llt_two_sets(cfg):
  """Makes eval_data a dict of two sets, as an experiment with several eval sets has it."""
  cfg.eval_data = {"validation": cfg.eval_data, "held_out": copy.deepcopy(cfg.eval_data)}


_TWO_SETS = ["--mode=print", "--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
             "--fiddler=tests.config.test_overrides.llt_two_sets"]


def test_a_dict_entry_is_set_from_the_command_line_and_printed_under_its_path():
  result = run_cli([*_TWO_SETS, "--fdl.eval_data['held_out'].num_batches=8"])
  assert result.code == 0, result.stderr
  lines = result.stdout.splitlines()
  assert any(l.startswith("eval_data.held_out.num_batches = 8 ") and l.endswith(
      "# command line: --fdl.eval_data['held_out'].num_batches=8") for l in lines)
  result = run_cli([*_TWO_SETS, "--fdl.eval_data.held_ot.num_batches=8"])
  assert result.code == 2 and result.stderr.count("\n") == 1, result
  assert ("--fdl.eval_data.held_ot.num_batches=8: eval_data has no entry 'held_ot'; did you "
          "mean 'held_out'?") in result.stderr


def test_a_key_that_is_not_an_identifier_is_reached_in_brackets():
  cfg = _set(_two_sets("held out", "a=b", "it's"),
             "--fdl.eval_data['held out'].num_batches=5",
             "--fdl.eval_data['a=b'].num_batches=6",  # The `=` of the key is not the flag's.
             """--fdl.eval_data["it's"].num_batches=7""")
  assert [d.num_batches for d in cfg.eval_data.values()] == [5, 6, 7]


@pytest.mark.parametrize("arg, message", [
    ("--fdl.eval_data.typo.num_batches=8",
     "--fdl.eval_data.typo.num_batches=8: eval_data has no entry 'typo'; its entries: held_out, "
     "validation"),
    ("--fdl.eval_data['typo'].num_batches=8",
     "--fdl.eval_data['typo'].num_batches=8: eval_data has no entry 'typo'; its entries: "
     "held_out, validation"),
    ("--fdl.eval_data.held_ot.num_batches=8",
     "--fdl.eval_data.held_ot.num_batches=8: eval_data has no entry 'held_ot'; did you mean "
     "'held_out'?"),
    ("--fdl.eval_data[0].num_batches=8",
     "--fdl.eval_data[0].num_batches=8: eval_data has no entry 0; its entries: held_out, "
     "validation"),
    ("--fdl.eval_data.typo=8",
     "--fdl.eval_data.typo=8: eval_data has no entry 'typo'; its entries: held_out, validation"),
    ("--fdl.eval_data.held_out=3",
     "--fdl.eval_data.held_out=3: eval_data.held_out must be DataSource, got int 3; a part is "
     "changed field by field (--fdl.eval_data.held_out.FIELD=VALUE), or replaced by a config in "
     "a fiddler"),
    ("--fdl.eval_data['held_out']=None",
     "--fdl.eval_data['held_out']=None: eval_data.held_out must be DataSource, got NoneType "
     "None; a part is changed field by field"),
    ("--fdl.eval_data.held_out.num_batche=8",
     "--fdl.eval_data.held_out.num_batche=8: SyntheticData (eval_data.held_out) has no field "
     "eval_data.held_out.num_batche; did you mean 'num_batches'?"),
    ("--fdl.eval_data.held_out.num_batches=0",
     "--fdl.eval_data.held_out.num_batches=0: must be a positive integer or None"),
    ("--fdl.eval_data.held_out.num_batches='8'",
     "--fdl.eval_data.held_out.num_batches='8': eval_data.held_out.num_batches must be int or "
     "None, got str '8'"),
    ("--fdl.eval_data.['held_out'].num_batches=8",
     """--fdl.eval_data.['held_out'].num_batches=8: cannot parse the field path "eval_data."""
     """['held_out'].num_batches"; use dotted names, [index] or ['key'], e.g. model.num_layers """
     "or eval_data['held_out'].num_batches"),
    # An unclosed quote, a bad escape, a key with a space that the shell unquoted.
    ("--fdl.eval_data['held_out.num_batches=8",
     """--fdl.eval_data['held_out.num_batches=8: cannot parse the field path "eval_data"""
     """['held_out.num_batches"; use dotted names"""),
    (r"--fdl.eval_data['\x'].num_batches=8",
     r"""--fdl.eval_data['\x'].num_batches=8: cannot parse the field path "eval_data['\\x']"""),
    ("--fdl.eval_data[held out].num_batches=8",
     "--fdl.eval_data[held out].num_batches=8: cannot parse the field path 'eval_data[held "
     "out].num_batches'; use dotted names"),
])
def test_a_bad_dict_entry_is_one_line_naming_the_flag(arg, message):
  with pytest.raises(UsageError) as error:
    _set(_two_sets(), arg)
  assert str(error.value).startswith(message), str(error.value)
  assert "\n" not in str(error.value)


def test_entries_are_listed_with_their_path_spelling():
  with pytest.raises(UsageError, match=r"no entry 'x'; its entries: 'held out', validation$"):
    _set(_two_sets("validation", "held out"), "--fdl.eval_data.x.num_batches=1")


def test_list_elements_are_still_reached_by_index():
  cfg = registry.lookup("PyCodeMixtureTiny").config()
  overrides.apply(cfg, override_directives(["--fdl.train_data.sources[1].seed=3"]), None)
  assert [s.seed for s in cfg.train_data.sources] == [0, 3]
  for arg, message in (
      ("--fdl.train_data.sources[0]=3", "--fdl.train_data.sources[0]=3: set a whole field, not "
                                        "one element of it"),
      ("--fdl.train_data.sources[5].seed=1", "--fdl.train_data.sources[5].seed=1: "
                                             "train_data.sources has no element [5]")):
    with pytest.raises(UsageError) as error:
      overrides.apply(cfg, override_directives([arg]), None)
    assert str(error.value) == message


@dataclasses.dataclass(frozen=True)
class _Weights:
  weights: dict[str, PositiveInt]


def test_an_entry_of_a_dict_of_literals_is_set_checked_and_labelled():
  cfg = fdl.Config(_Weights, weights={"code": 1, "prose": 2})
  _set(cfg, "--fdl.weights.prose=5")
  assert cfg.weights == {"code": 1, "prose": 5}
  # Fiddle keeps history per field: the field holding the dict is labelled with the flag.
  assignment, origin = config_files.to_text(cfg).splitlines()[1].split("  # ")
  assert (assignment.rstrip(), origin) == ("weights = {'code': 1, 'prose': 5}",
                                           "command line: --fdl.weights.prose=5")
  for arg, message in (
      ("--fdl.weights.prose=0", "--fdl.weights.prose=0: must be a positive integer"),
      ("--fdl.weights.prose=1.5", "--fdl.weights.prose=1.5: weights.prose must be int, got "
                                  "float 1.5"),
      ("--fdl.weights.poetry=1", "--fdl.weights.poetry=1: weights has no entry 'poetry'; its "
                                 "entries: code, prose")):
    with pytest.raises(UsageError) as error:
      _set(cfg, arg)
    assert str(error.value) == message
  assert cfg.weights == {"code": 1, "prose": 5}
