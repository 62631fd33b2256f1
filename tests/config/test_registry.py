"""Experiment lookup: full names, dotted suffixes, import paths, and the errors."""

import importlib
import os
import re
import sys
import textwrap

import fiddle as fdl
import pytest

import experiments
import lingvo_lite
from lingvo_lite.config import builtin_packages, registry
from lingvo_lite.runtime import user_code
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Experiment


def _make(module: str, name: str) -> type:
  return type(name, (Experiment,), {"__module__": module, "__qualname__": name})


@pytest.fixture(name="twins")
def fixture_twins():
  created = [registry.register(_make("experiments.fake_a", "Twin")),
             registry.register(_make("experiments.fake_b", "Twin"))]
  yield created
  for cls in created:
    registry._REGISTRY.pop(registry.registered_name(cls))


def test_full_name_and_dotted_suffixes_find_the_experiment():
  from experiments.lm.pycode import PyCodeTiny
  for name in ("lm.pycode.PyCodeTiny", "pycode.PyCodeTiny", "PyCodeTiny"):
    assert registry.lookup(name) is PyCodeTiny


def test_import_path_is_imported_on_demand():
  from experiments.lm.gptj import GptJ6B
  assert registry.lookup("experiments.lm.gptj.GptJ6B") is GptJ6B


def test_ambiguous_suffix_lists_every_match(twins):
  del twins
  with pytest.raises(UsageError, match="ambiguous, matches fake_a.Twin, fake_b.Twin"):
    registry.lookup("Twin")
  assert registry.lookup("fake_b.Twin").__module__ == "experiments.fake_b"


def test_unknown_name_suggests_the_closest():
  with pytest.raises(UsageError, match=r"--exp=PyCodeTiyn: no such experiment; did you mean "
                                       r"lm\.pycode\.PyCodeTiny"):
    registry.lookup("PyCodeTiyn")


def test_registering_two_classes_under_one_name_fails_at_import():
  registry.register(_make("experiments.fake_c", "Once"))
  try:
    with pytest.raises(ValueError, match="'fake_c.Once' is registered twice"):
      registry.register(_make("experiments.fake_c", "Once"))  # Same name, another class.
  finally:
    registry._REGISTRY.pop("fake_c.Once")


def test_list_includes_every_experiment_module():
  names = registry.all_experiments()
  for expected in ("lm.pycode.PyCodeTiny", "lm.gptj.GptJ6B", "lm.llama.Llama1B",
                   "lm.gpt2.Gpt2Small"):
    assert expected in names


# ----------------------------------------------------------------------------- broken modules


def _write(folder, relative: str, text: str) -> None:
  path = folder / relative
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(textwrap.dedent(text))


@pytest.fixture(name="forget_modules")
def fixture_forget_modules():
  """Names of modules a test creates: unregistered and unimported afterwards."""
  prefixes: list[str] = []
  yield prefixes
  for module in [m for m in sys.modules if any(m.startswith(p) for p in prefixes)]:
    del sys.modules[module]
  for name, cls in list(registry._REGISTRY.items()):
    if any(cls.__module__.startswith(p) for p in prefixes):
      del registry._REGISTRY[name]
  registry._failures.clear()


_GOOD = """\
    from lingvo_lite.experiment import Experiment
    from lingvo_lite.config.registry import register

    @register
    class {name}(Experiment):
      \"\"\"Registered by a test.\"\"\"
    """


def test_a_broken_experiment_module_is_reported_and_the_rest_still_register(
    tmp_path, monkeypatch, forget_modules):
  forget_modules += ["experiments.llt_", "llt_"]
  _write(tmp_path, "llt_good.py", _GOOD.format(name="LltGood"))
  _write(tmp_path, "llt_syntax.py", "x = (\n")
  _write(tmp_path, "llt_raises.py", "raise RuntimeError('boom')\n")
  _write(tmp_path, "llt_dependency.py", "import llt_no_such_dependency\n")
  _write(tmp_path, "llt_pkg/__init__.py", "raise ValueError('package init')\n")
  # Registers a class, then fails: a retried import must not find its name taken.
  _write(tmp_path, "llt_half.py", _GOOD.format(name="LltHalf") + "raise KeyError('late')\n")
  monkeypatch.setattr(experiments, "__path__", [*experiments.__path__, str(tmp_path)])

  for _ in range(2):
    names = registry.all_experiments()
    assert "lm.pycode.PyCodeTiny" in names and "llt_good.LltGood" in names
    assert "llt_half.LltHalf" not in names
    failures = registry.import_failures()
    assert failures["experiments.llt_syntax"] == (
        "SyntaxError: '(' was never closed (llt_syntax.py, line 1)")
    assert failures["experiments.llt_raises"].startswith("RuntimeError: boom (at ")
    assert failures["experiments.llt_raises"].endswith("llt_raises.py:1)")
    assert "ModuleNotFoundError: No module named 'llt_no_such_dependency'" in (
        failures["experiments.llt_dependency"])
    assert failures["experiments.llt_pkg"].startswith("ValueError: package init")
    assert failures["experiments.llt_half"].startswith("KeyError: 'late'")
    assert all("\n" not in error for error in failures.values())

  assert registry.lookup("PyCodeTiny").__name__ == "PyCodeTiny"
  assert registry.lookup("LltGood").__name__ == "LltGood"
  with pytest.raises(UsageError, match=r"^--exp=LltNoSuch: no such experiment; .*; 5 "
                                       r"experiment modules failed to import: "
                                       r"experiments\.llt_dependency, .*\(see --mode=list\)$"):
    registry.lookup("LltNoSuch")
  # An import path into a broken module names the module and its error.
  with pytest.raises(UsageError, match=r"^--exp=llt_syntax\.X: importing module "
                                       r"experiments\.llt_syntax failed: SyntaxError: "):
    registry.lookup("llt_syntax.X")


def test_entry_points_register_their_modules_and_report_broken_ones(tmp_path, monkeypatch,
                                                                    forget_modules):
  forget_modules += ["llt_ep_pkg"]
  _write(tmp_path, "llt_ep_pkg/__init__.py", "")
  _write(tmp_path, "llt_ep_pkg/exps.py", _GOOD.format(name="LltEntryExp"))
  _write(tmp_path, "llt_ep_pkg/broken.py", "import llt_no_such_dependency\n")
  _write(tmp_path, "llt_ep_pkg-1.0.dist-info/METADATA",
         "Metadata-Version: 2.1\nName: llt-ep-pkg\nVersion: 1.0\n")
  _write(tmp_path, "llt_ep_pkg-1.0.dist-info/entry_points.txt",
         "[lingvo_lite.experiments]\nexps = llt_ep_pkg.exps\nbroken = llt_ep_pkg.broken\n"
         "gone = llt_ep_pkg.gone\n")
  monkeypatch.syspath_prepend(str(tmp_path))

  for name in ("LltEntryExp", "exps.LltEntryExp", "llt_ep_pkg.exps.LltEntryExp"):
    assert registry.lookup(name).__module__ == "llt_ep_pkg.exps"
  assert "llt_ep_pkg.exps.LltEntryExp" in registry.all_experiments()
  failures = registry.import_failures()
  assert failures["llt_ep_pkg.broken"].startswith(
      "entry point broken = llt_ep_pkg.broken of distribution llt-ep-pkg (group "
      "lingvo_lite.experiments): ModuleNotFoundError: No module named 'llt_no_such_dependency'")
  assert failures["llt_ep_pkg.gone"].endswith(": no module named 'llt_ep_pkg.gone' on sys.path")


def test_import_modules_registers_or_fails_in_one_line(tmp_path, monkeypatch, forget_modules):
  forget_modules += ["llt_flag_"]
  _write(tmp_path, "llt_flag_exps.py", _GOOD.format(name="LltFlagExp"))
  _write(tmp_path, "llt_flag_broken.py", "def f(:\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  registry.import_modules(["llt_flag_exps"])
  assert registry.lookup("LltFlagExp").__module__ == "llt_flag_exps"
  with pytest.raises(UsageError, match=r"^--experiments_module=llt_flag_broken: importing "
                                       r"module llt_flag_broken failed: SyntaxError: "):
    registry.import_modules(["llt_flag_exps", "llt_flag_broken"])
  with pytest.raises(UsageError, match=r"^--experiments_module=llt_flag_none: no module named "
                                       r"'llt_flag_none'; run from the folder"):
    registry.import_modules(["llt_flag_none"])
  with pytest.raises(UsageError, match="not a dotted module name"):
    registry.import_modules(["llt-flag"])


# ----------------------------------------------------------------------------- import paths


@pytest.mark.parametrize("name, message", [
    ("os.path.join", "posixpath.join is a Python standard library function, not a config "
                     "function"),
    ("shutil.rmtree", "shutil.rmtree is a Python standard library function"),
    ("os.remove", "is a built-in function, not an experiment class"),
    ("os.sep", "is a str value, not an experiment class"),
    ("json", "is a module, not an experiment"),
    ("lm", "is a module, not an experiment"),
    ("lingvo_lite.experiment.Setup", "the class lingvo_lite.experiment.Setup has no config() "
                                     "classmethod"),
    ("lingvo_lite.config.registry.LltMissing", "no such experiment (lingvo_lite.config.registry has no "
                                        "attribute 'LltMissing')"),
    ("lingvo_lite.executor.run_main", "lingvo_lite.executor.run_main is part of lingvo_lite "
                                      "itself, not a config function"),
    ("fiddle.build", "fiddle._src.building.build is a function of the installed distribution "
                     "fiddle, not a config function"),
    ("A" * 10_001, "the value is 10001 characters long"),
    ("f(x=" + "-" * 5000 + "1)", "expected NAME or NAME(key=literal, ...)"),
    ("f(**{})", "pass arguments by keyword"),
])
def test_import_paths_to_anything_but_experiments_are_refused(name, message):
  with pytest.raises(UsageError) as error:
    registry.config_from_flag("--exp", name)
  assert str(error.value).startswith(f"--exp={name}: " if len(name) < 10_000 else "--exp: ")
  assert message in str(error.value)
  assert "\n" not in str(error.value)


def llt_returns_a_dict():
  return {"model": 1}


def llt_raises():
  return {}["model"]


_calls = []


def llt_needs_layers(layers):
  _calls.append(layers)
  return fdl.Config(dict, layers=layers)


def test_config_functions_are_checked_before_and_after_the_call():
  where = __name__
  with pytest.raises(UsageError, match=rf"llt_returns_a_dict\(\) returned a dict, not a "
                                       r"fdl\.Config$"):
    registry.config_from_flag("--fdl_config", f"{where}.llt_returns_a_dict")
  # Wrong arguments are refused before the function runs.
  with pytest.raises(UsageError, match=r"missing a required argument: 'layers'; "
                                       r".*llt_needs_layers\(\) takes layers$"):
    registry.config_from_flag("--fdl_config", f"{where}.llt_needs_layers")
  with pytest.raises(UsageError, match="unexpected keyword argument 'depth'"):
    registry.config_from_flag("--fdl_config", f"{where}.llt_needs_layers(layers=2, depth=1)")
  assert not _calls
  cfg, experiment = registry.config_from_flag("--fdl_config", f"{where}.llt_needs_layers(layers=3)")
  assert (cfg.layers, experiment, _calls) == (3, None, [3])


def llt_exits():
  raise SystemExit("bad\nthing")


def test_library_functions_annotated_to_return_a_config_may_be_called():
  # lingvo_lite's own, but `-> fdl.Config[Setup]`: a config function, not the CLI or a tool.
  cfg, experiment = registry.config_from_flag("--exp", "lingvo_lite.experiment.setup_config")
  assert isinstance(cfg, fdl.Config) and experiment is None


@pytest.mark.parametrize("name, owner", [
    ("shutil.rmtree", "shutil.rmtree is a Python standard library function"),
    ("os.path.join", "posixpath.join is a Python standard library function"),
    ("fiddle.build", "is a function of the installed distribution fiddle"),
    ("lingvo_lite.executor.run_main", "is part of lingvo_lite itself"),
    ("tasks.pycode.pycode_task", "is part of lingvo_lite itself"),
    ("experiments.lm.architectures.llama", None),
    (f"{__name__}.llt_exits", None),
])
def test_whose_code_a_function_is(name, owner):
  module, _, attribute = name.rpartition(".")
  found = user_code.foreign_code(getattr(importlib.import_module(module), attribute))
  assert found == owner if owner is None else owner in found


class LltBroken(Experiment):
  """An experiment whose config() has a bug."""

  @classmethod
  def config(cls):
    raise AttributeError("'Config' has no attribute 'num_layer'")


@pytest.mark.parametrize("flag, name, raised", [
    ("--fdl_config", "llt_raises", f"{__name__}.llt_raises() raised KeyError: 'model'"),
    ("--fdl_config", "llt_exits", f"{__name__}.llt_exits() raised SystemExit: bad"),
    ("--exp", "LltBroken",
     "LltBroken.config() raised AttributeError: 'Config' has no attribute 'num_layer'"),
])
def test_config_code_that_raises_or_exits_is_one_line_naming_it(flag, name, raised):
  """A config function's or an experiment's own error: the flag, what raised, where."""
  with pytest.raises(UsageError, match=rf"^{re.escape(f'{flag}={__name__}.{name}: {raised}')} "
                                       r"\(at .*test_registry\.py:\d+\)$"):
    registry.config_from_flag(flag, f"{__name__}.{name}")


# ----------------------------------------------------------------------------- namespaces


def test_a_shadowing_package_is_replaced_by_ours_and_stays_importable(tmp_path, monkeypatch,
                                                                      forget_modules):
  """What `builtin_packages.install()` does for `experiments` when the working directory has
  its own, on a made-up package name (the real one is already imported in this process)."""
  forget_modules += ["llt_ns"]
  _write(tmp_path, "ours/llt_ns/__init__.py", "ORIGIN = 'ours'\n")
  _write(tmp_path, "ours/llt_ns/lm/__init__.py", "")
  _write(tmp_path, "ours/llt_ns/lm/base.py", "ORIGIN = 'ours'\n")
  _write(tmp_path, "theirs/llt_ns/__init__.py", "raise RuntimeError('their __init__ ran')\n")
  _write(tmp_path, "theirs/llt_ns/mine.py", "ORIGIN = 'theirs'\n")
  _write(tmp_path, "theirs/llt_ns/lm/__init__.py", "")
  monkeypatch.syspath_prepend(str(tmp_path / "theirs"))  # As the working directory is.
  ours = str(tmp_path / "ours" / "llt_ns")

  module = builtin_packages.ensure("llt_ns", ours)
  assert module is not None and module.ORIGIN == "ours"
  assert importlib.import_module("llt_ns.lm.base").ORIGIN == "ours"
  assert importlib.import_module("llt_ns.mine").ORIGIN == "theirs"
  assert builtin_packages.hidden()["llt_ns.lm"].startswith(
      f"{tmp_path / 'theirs' / 'llt_ns' / 'lm'} is not importable: {ours}/lm takes its name")
  assert builtin_packages.ensure("llt_ns", ours) is None  # Once is enough.
  builtin_packages._hidden.pop("llt_ns.lm")


def test_the_builtin_packages_are_the_ones_beside_lingvo_lite():
  root = os.path.dirname(os.path.dirname(os.path.abspath(lingvo_lite.__file__)))
  for name in builtin_packages.NAMES:
    assert builtin_packages.builtin_dir(name) == os.path.join(root, name)
    assert os.path.samefile(importlib.import_module(name).__path__[0], os.path.join(root, name))


def test_user_code_gets_keyword_arguments_of_any_name():
  # `--exp='X(where=...)'`: the caller's own parameters must not take the experiment's.
  assert user_code.call_user_code(lambda where, function: (where, function),
                                           "--exp=X: X()", where=1, function=2) == (1, 2)
