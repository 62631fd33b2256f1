"""Bad values are refused generically, whatever produced them: the type check of a whole config
before it is built (`config_checks`), the constraints declared with the fields (`fields`,
checked again by `Setup.validate()` on the built parts), and the split between a constructor
refusing a user's value (one line, exit 2) and an internal bug (a traceback)."""

import collections.abc
import copy
import dataclasses
import math
import time
from typing import Mapping

import fiddle as fdl
import pytest

from lingvo_lite import fields
from lingvo_lite.config import building, checks as config_checks, files as config_files
from lingvo_lite.data.source import DataSource
from lingvo_lite.data.synthetic import SyntheticData
from lingvo_lite.errors import UsageError, config_error
from lingvo_lite.experiment import Setup
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.testing import run_cli, synthetic_tiny_setup, tiny_config


def _config():
  return tiny_config("PyCodeTiny", synthetic=True)


def _refused(cfg) -> str:
  with pytest.raises(UsageError) as error:
    config_checks.check(cfg)
  message = str(error.value)
  assert "\n" not in message
  return message


def test_the_whole_tree_is_type_checked_before_building():
  cfg = _config()
  cfg.model = 3
  assert _refused(cfg).startswith("model=3: must be LanguageModel, got int")
  cfg = _config()
  cfg.train_data = None
  assert _refused(cfg).startswith("train_data=None: must be DataSource, got NoneType")
  cfg = _config()
  cfg.model.num_layers = None
  assert _refused(cfg) == "model.num_layers=None: must be int, got NoneType"
  cfg = _config()
  cfg.optimizer = fdl.Config(Partitioner)
  assert _refused(cfg).startswith("optimizer=<config of Partitioner>: must be AdamW")
  cfg = _config()
  cfg.partitioner.rules = (("batch", "data"), 3)  # Elements are checked too.
  assert _refused(cfg) == ("partitioner.rules=(('batch', 'data'), 3): must be "
                           "tuple[tuple[str, Any], ...], got tuple")


def test_a_missing_required_argument_names_its_path():
  cfg = _config()
  del cfg.model.num_layers
  assert _refused(cfg).startswith("model.num_layers: required by GptJ and not set; "
                                  "give it in the experiment or with --fdl.model.num_layers=")


def test_constraints_are_checked_in_the_tree_too():
  cfg = _config()
  cfg.eval_data.global_batch_size = 0
  assert _refused(cfg) == "eval_data.global_batch_size=0: must be a positive integer or None"
  cfg = _config()
  cfg.optimizer.b1 = 1.0
  assert _refused(cfg) == "optimizer.b1=1.0: must be in [0, 1)"


def test_a_config_file_with_a_bad_value_is_one_line(tmp_path):
  cfg = _config()
  cfg.model.num_heads = 0  # As an edited config.json, or an older version's, would hold it.
  config_files.write(tmp_path / "old", cfg)
  result = run_cli([f"--fdl_config_file={tmp_path / 'old' / 'config.json'}",
                    f"--job_log_dir={tmp_path / 'new'}"])
  assert result.code == 2
  assert result.stderr.strip() == (
      "lingvo_lite: error: model.num_heads=0: must be a positive integer")
  assert not (tmp_path / "new").exists()


def test_set_time_checks_name_the_flag():
  for args, message in ((["--fdl.model.num_layers=0"], "--fdl.model.num_layers=0: must be a "
                         "positive integer"),
                        (["--fdl.optimizer.eps=1e999"], "--fdl.optimizer.eps=1e999: must be a "
                         "finite number"),
                        (["--fdl.model=3"], "--fdl.model=3: model must be LanguageModel, got "
                         "int 3; a part is changed field by field")):
    result = run_cli(["--mode=print", "--exp=PyCodeTiny", *args])
    assert result.code == 2 and message in result.stderr, result.stderr


def _built(**changes):
  """A built tiny Setup with parts replaced, bypassing every check before validate()."""
  setup = synthetic_tiny_setup()
  parts = {}
  for path, value in changes.items():
    part_name, field = path.split("__")
    part = parts.get(part_name, getattr(setup, part_name))
    parts[part_name] = (part.clone(**{field: value}) if part_name == "model"
                        else dataclasses.replace(part, **{field: value}))
  return dataclasses.replace(setup, **parts)


@pytest.mark.parametrize("changes, message", [
    ({"model__num_heads": 0}, "model.num_heads=0: must be a positive integer"),
    ({"model__head_dim": -2}, "model.head_dim=-2: must be a positive integer or None"),
    ({"partitioner__dcn_data": 0}, "partitioner.dcn_data=0: must be a positive integer"),
    ({"partitioner__ici_data": -2}, "partitioner.ici_data=-2: must be a positive integer or -1"),
    ({"optimizer__peak_learning_rate": -3e-4},
     "optimizer.peak_learning_rate=-0.0003: must be a positive number"),
    ({"optimizer__weight_decay": -0.1}, "optimizer.weight_decay=-0.1: must be >= 0"),
    ({"optimizer__b2": 1.5}, "optimizer.b2=1.5: must be in [0, 1)"),
    ({"train__z_loss": math.inf}, "train.z_loss=inf: must be a finite number"),
    ({"train__profile_start_step": -3}, "train.profile_start_step=-3: must be >= -1"),
    ({"train__steps": 2.5}, "train.steps=2.5: must be int, got float"),
    ({"train__log_grad_norm": 1}, "train.log_grad_norm=1: must be bool, got int"),
    ({"train_data__period": -1}, "train_data.period=-1: must be >= 0"),
    ({"checkpoint__max_to_keep": 0}, "checkpoint.max_to_keep=0: must be a positive integer"),
    ({"eval_data__sequence_length": 0}, "eval_data.sequence_length=0: must be in [1, "),
    ({"model__norm": "rms"}, "model.norm='rms': valid choices: 'layernorm', 'rmsnorm'"),
    # A value whose repr Python refuses (over 4300 digits), or that would not fit one line.
    ({"model__norm": 1 << 20000}, "model.norm=<int of 20001 bits>: valid choices: "),
    ({"model__norm": "x" * 100}, "model.norm=<str of 100 characters>: valid choices: "),
    ({"train__steps": [1] * 100}, "train.steps=<list of 100 items>: must be int, got list"),
])
def test_validate_checks_every_part_generically(changes, message):
  setup = _built(**changes)
  with pytest.raises(UsageError) as error:
    setup.validate()
  assert str(error.value).startswith(message), str(error.value)


def _float_fields():
  """(part, field) of every float field of the parts a Setup holds, from their annotations."""
  setup = synthetic_tiny_setup()
  found = []
  for part_name in ("model", "optimizer", "train", "train_data", "partitioner", "checkpoint"):
    part = getattr(setup, part_name)
    for name, hint in fields.type_hints(type(part)).items():
      if fields.matches(1.5, hint) is True and fields.matches("x", hint) is not True:
        found.append(f"{part_name}__{name}")
  return found


@pytest.mark.parametrize("path", _float_fields())
def test_every_float_field_must_be_finite(path):
  part_name, field = path.split("__")
  with pytest.raises(UsageError, match=rf"^{part_name}\.{field}=inf: must be a finite number"):
    _built(**{path: math.inf}).validate()


def test_the_float_fields_are_found():
  assert {"optimizer__peak_learning_rate", "train__z_loss", "model__norm_eps",
          "optimizer__clip_grad_norm"} <= set(_float_fields())


def test_absurd_sizes_are_refused_before_anything_is_traced():
  with pytest.raises(UsageError, match=r"^model.dim=1000000000: makes 2.4e\+19 parameters"):
    _built(model__dim=10**9).validate()
  with pytest.raises(UsageError, match=r"^model.vocab_size=3000000000: must be in \[1, "):
    _built(model__vocab_size=3 * 10**9).validate()
  with pytest.raises(UsageError, match=r"^model.mlp_dim=100000000000000000000: is past int64"):
    _built(model__mlp_dim=10**20).validate()


def test_a_deep_model_validates_without_tracing_every_layer():
  started = time.perf_counter()
  # 5e9 parameters, scanned: valid, if not for this host.
  _built(model__num_layers=100_000, model__scan_layers=True).validate()
  assert time.perf_counter() - started < 30
  # Unrolled, each layer would be traced and compiled as its own code: refused in one line.
  with pytest.raises(UsageError, match=r"model.num_layers=100000: unrolled \(model.scan_layers"
                                       r"=False\): more than 1024 layers"):
    _built(model__num_layers=100_000).validate()


def test_the_partitioning_check_sees_the_layers_axis_of_a_scanned_model():
  setup = _built(model__scan_layers=True, model__num_layers=3,
                 partitioner__rules=(*Partitioner().rules[:-1], ("layers", "data")),
                 partitioner__ici_data=1)
  setup.validate()  # One device: any size divides.
  shapes = {p.path: p for p in setup.model.parameter_shapes()}
  kernel = shapes["['layers']['attention']['query_kernel']"]
  assert kernel.shape[0] == 3 and kernel.axes[0] == "layers" and kernel.repeats == 1


def _rules(**targets):
  return tuple((name, targets.get(name, target)) for name, target in Partitioner().rules)


@pytest.mark.parametrize("rules, message", [
    (_rules(batch=3), "partitioner.rules=('batch', 3): a rule maps a logical axis to None, a "
                      "mesh axis name or a tuple of mesh axis names"),
    (_rules(batch=("data", 1)), "partitioner.rules=('batch', ('data', 1)): a rule maps"),
    (_rules(embed=("fsdp", "fsdp")), "partitioner.rules=('embed', ('fsdp', 'fsdp')): names a "
                                     "mesh axis twice"),
    (_rules(mlp="fsdp"), "partitioner.rules='embed -> fsdp, mlp -> fsdp': parameter "
                         "['layer_0']['mlp']['wi']['kernel'] has dimensions 'embed' and 'mlp'"),
    (_rules(vocab=("data", "fsdp")), "partitioner.rules='vocab -> fsdp, embed -> fsdp': "
                                     "parameter ['embedding']"),
])
def test_partitioner_rules_that_cannot_shard_are_refused(rules, message):
  with pytest.raises(UsageError) as error:
    _built(partitioner__rules=rules).validate()
  assert str(error.value).startswith(message), str(error.value)


def test_a_fallback_rule_lets_two_dimensions_name_one_mesh_axis():
  # Flax tries a logical axis's rules in order: the second is the user's choice when the
  # first one's mesh axis is taken (by `embed` in mlp/wi, by `mlp` in mlp/wo).
  _built(partitioner__rules=(*_rules(mlp="fsdp"), ("mlp", None), ("embed", None))).validate()


def test_a_seqio_vocabulary_larger_than_the_model_is_refused():
  cfg = tiny_config("PyCodeTiny", "model.vocab_size=100")
  with pytest.raises(UsageError, match=r"^model.vocab_size=100: is smaller than the 259 tokens "
                                       r"of train_data's vocabulary; use at least 259$"):
    building.build(cfg)


class _Refuses:
  """A constructor that rejects one of its arguments the house way."""

  def __init__(self, depth: int = 3):
    raise config_error("depth", depth, "too deep", "use 1")


class _Crashes:
  """A constructor with a bug in it."""

  def __init__(self, depth: int = 3):
    raise RuntimeError(f"internal bug at depth {depth}")


def test_a_constructor_refusing_a_value_is_named_by_its_config_path():
  cfg = tiny_config("PyCodeTiny")
  cfg.train_data.task = fdl.Config(_Refuses, depth=7)  # `task: Any` takes any config.
  with pytest.raises(UsageError) as error:
    building.build(cfg)
  assert str(error.value) == "train_data.task.depth=7: too deep; use 1"


def test_any_other_constructor_error_is_not_a_usage_error():
  cfg = tiny_config("PyCodeTiny")
  cfg.train_data.task = fdl.Config(_Crashes)
  with pytest.raises(RuntimeError, match="internal bug at depth 3"):
    building.build(cfg)


def test_an_internal_bug_keeps_its_traceback(tmp_path, monkeypatch):
  (tmp_path / "buggy.py").write_text(
      "import fiddle as fdl\n"
      "class Crashes:\n"
      "  def __init__(self):\n"
      "    raise RuntimeError('internal bug')\n"
      "def fiddle(cfg):\n"
      "  cfg.train_data.task = fdl.Config(Crashes)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  # An exception other than UsageError leaves the executor (absl's app.run prints it with
  # its traceback and exits 1) instead of becoming a one-line usage error.
  with pytest.raises(RuntimeError, match="internal bug"):
    run_cli(["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=buggy.fiddle",
             f"--job_log_dir={tmp_path / 'job'}"])
  assert not (tmp_path / "job").exists()


def test_range_requirements_read_as_words():
  assert fields.Positive.requirement(integer=True) == "a positive integer"
  assert fields.Positive.requirement(integer=False) == "a positive number"
  assert fields.NonNegative.requirement(integer=False) == ">= 0"
  assert fields.Range(0, 1, high_open=True).requirement(integer=False) == "in [0, 1)"
  assert fields.Range(1, also=(-1,), note="the rest").requirement(integer=True) == (
      "a positive integer or -1 (the rest)")
  assert fields.Range(1, also=(-1,)).problem(-1) is None
  assert fields.value_problem(float("nan"), fields.PositiveFloat) == "must be a finite number"


# ----------------------------------------------------------------------------- containers


def _two_sets(*keys):
  """The synthetic tiny config with eval_data a dict of sets named `keys`."""
  cfg = _config()
  cfg.eval_data = {key: copy.deepcopy(cfg.eval_data) for key in keys or ("validation",
                                                                          "held_out")}
  return cfg


def test_a_dict_of_sources_is_checked_entry_by_entry_under_the_path_a_flag_types():
  config_checks.check(_two_sets())  # Valid as it is.
  cfg = _two_sets()
  cfg.eval_data["held_out"].num_batches = 0
  assert _refused(cfg) == "eval_data.held_out.num_batches=0: must be a positive integer or None"
  cfg = _two_sets("validation", "held out")
  cfg.eval_data["held out"].num_batches = 0
  assert _refused(cfg) == ("eval_data['held out'].num_batches=0: must be a positive integer or "
                           "None")
  cfg = _two_sets()
  del cfg.eval_data["held_out"].sequence_length
  assert _refused(cfg) == (
      "eval_data.held_out.sequence_length: required by SyntheticData and not set; give it in "
      "the experiment or with --fdl.eval_data.held_out.sequence_length=VALUE")


def test_a_dict_entry_of_the_wrong_kind_is_named_by_its_key():
  cfg = _two_sets()
  cfg.eval_data["held_out"] = 3
  assert _refused(cfg) == (
      "eval_data.held_out=3: must be DataSource, got int; a part is changed field by field "
      "(eval_data.held_out.FIELD=VALUE), or replaced by a config in a fiddler")
  cfg = _two_sets()
  cfg.eval_data["held_out"] = fdl.Config(Partitioner)
  assert _refused(cfg) == ("eval_data.held_out=<config of Partitioner>: must be DataSource; "
                           "give a config of DataSource instead")
  cfg = _two_sets()
  cfg.eval_data = [cfg.eval_data["validation"]]  # Neither a source nor a mapping of them.
  assert _refused(cfg) == (
      "eval_data=<list of 1 items>: must be DataSource or mapping of str to DataSource or None, "
      "got list; a part is changed field by field (eval_data.FIELD=VALUE), or replaced by a "
      "config in a fiddler")


def test_validate_checks_the_parts_inside_a_dict():
  setup = synthetic_tiny_setup()
  source = setup.eval_data
  with pytest.raises(UsageError) as error:
    dataclasses.replace(setup, eval_data={
        "validation": source, "held_out": dataclasses.replace(source, num_batches=0)}).validate()
  assert str(error.value) == "eval_data.held_out.num_batches=0: must be a positive integer or None"
  with pytest.raises(UsageError) as error:
    fields.check_part("", dataclasses.replace(setup, eval_data={"validation": source,
                                                                "held out": 3}))
  assert str(error.value).startswith("eval_data['held out']=3: must be DataSource, got int; ")
  fields.check_part("", dataclasses.replace(setup, eval_data={"validation": source}))


@dataclasses.dataclass(frozen=True)
class _Leaf:
  size: fields.PositiveInt = 1


@dataclasses.dataclass(frozen=True)
class _Holder:
  leaves: tuple[_Leaf, ...] = ()
  named: Mapping[str, _Leaf] = dataclasses.field(default_factory=dict)
  weights: dict[str, fields.PositiveFloat] = dataclasses.field(default_factory=dict)


@pytest.mark.parametrize("holder, message", [
    (_Holder(leaves=(_Leaf(), _Leaf(0))), "part.leaves[1].size=0: must be a positive integer"),
    (_Holder(named={"a": _Leaf(), "b c": _Leaf(-1)}),
     "part.named['b c'].size=-1: must be a positive integer"),
    (_Holder(named={"a": 3}), "part.named.a=3: must be _Leaf, got int; a part is changed field by "
                              "field (part.named.a.FIELD=VALUE)"),
    (_Holder(weights={"x": 1.0, "y": -2.0}), "part.weights.y=-2.0: must be a positive number"),
    (_Holder(weights={"x": "a"}), "part.weights.x='a': must be float, got str"),
])
def test_check_part_walks_into_lists_and_dicts(holder, message):
  with pytest.raises(UsageError) as error:
    fields.check_part("part", holder)
  assert str(error.value).startswith(message), str(error.value)


def test_mapping_annotations_are_matched_and_worded():
  source = fdl.Config(SyntheticData, vocab_size=8, sequence_length=4)
  eval_data = fields.type_hints(Setup)["eval_data"]
  type_of = config_checks.built_type
  for annotation in (Mapping[str, DataSource], collections.abc.Mapping[str, DataSource],
                     dict[str, DataSource], eval_data):
    assert fields.matches({"a": source}, annotation, type_of) is True, annotation
    assert fields.matches({"a": fdl.Config(Partitioner)}, annotation, type_of) is False
    assert fields.matches({"a": source}, annotation) is False  # A config is not a source yet.
  assert fields.matches({"a": 1}, Mapping[str, int]) is True
  assert fields.matches({1: 1}, Mapping[str, int]) is False
  assert fields.matches([1], Mapping[str, int]) is False
  assert fields.matches({"a": 1}, collections.abc.Mapping) is True
  assert fields.describe(eval_data) == "DataSource or mapping of str to DataSource or None"
  assert fields.describe(dict[str, int]) == "dict of str to int"
  assert fields.describe(Mapping[str, int | None]) == "mapping of str to (int or None)"
  assert fields.entry_annotation(eval_data, {}, "x") is DataSource
  assert fields.entry_annotation(eval_data, [], 0) is None
  assert fields.entry_annotation(tuple[int, str], (1, "a"), 1) is str


def test_paths_are_spelled_as_flags_write_them():
  assert fields.path_join("", "model") == "model"
  assert fields.path_join("eval_data", "held_out") == "eval_data.held_out"
  assert fields.path_join("eval_data", "held out") == "eval_data['held out']"
  assert fields.path_join("eval_data", "2nd") == "eval_data['2nd']"
  assert fields.path_join("train_data.sources", 0) == "train_data.sources[0]"
