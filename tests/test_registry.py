"""Experiment lookup: full names, dotted suffixes, import paths, and the errors."""

import pytest

from lingvo_lite import registry
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
