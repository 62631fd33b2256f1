"""The experiment class a job's config.json records, found again (config/registry.py:
recorded_class): the executor applies its fiddlers to the reloaded config, and the report
compares the job's fields with its defaults. Gone, no longer a class, or failing to import:
never an error there, and the report says which in its note."""

import sys
import textwrap

import pytest

from lingvo_lite.config import diffs as config_diffs, registry

from experiments.lm.pycode import PyCodeTiny

_defaults = config_diffs._defaults  # pylint: disable=protected-access


@pytest.fixture(name="user_module")
def fixture_user_module(tmp_path, monkeypatch):
  """A user module `recorded_exps` on sys.path: an experiment, a function, a broken config."""
  (tmp_path / "recorded_exps.py").write_text(textwrap.dedent("""
      from experiments.lm.pycode import PyCodeTiny

      class Mine(PyCodeTiny):
        pass

      class Broken(PyCodeTiny):
        @classmethod
        def config(cls):
          raise ValueError("a bug since the run\\nsecond line")

      class NoConfig:
        pass

      def function():
        pass
      """))
  (tmp_path / "failing_exps.py").write_text("raise RuntimeError('cannot import me')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  yield
  for name in ("recorded_exps", "failing_exps"):
    sys.modules.pop(name, None)


def test_a_recorded_class_is_found_or_none_with_the_import_error(user_module):
  del user_module
  assert registry.recorded_class("experiments.lm.pycode.PyCodeTiny") == (PyCodeTiny, None)
  found, error = registry.recorded_class("recorded_exps.Mine")
  assert found.__name__ == "Mine" and issubclass(found, PyCodeTiny) and error is None
  for gone in ("recorded_exps.Renamed", "recorded_exps.function", "no_such_module.Exp"):
    found, error = registry.recorded_class(gone)
    assert found is None, gone
    # A missing module is an import that raised; a missing name or a non-class is not.
    assert (error is not None) == gone.startswith("no_such_module"), (gone, error)
  found, error = registry.recorded_class("failing_exps.Exp")
  assert found is None and isinstance(error, RuntimeError) and "cannot import me" in str(error)


def test_the_report_says_why_it_shows_no_defaults(user_module):
  del user_module
  defaults, note = _defaults("experiments.lm.pycode.PyCodeTiny")
  assert note is None and defaults["model.num_layers"] == str(PyCodeTiny.config().model.num_layers)
  for name in ("recorded_exps.Renamed", "recorded_exps.function", "recorded_exps.NoConfig"):
    assert _defaults(name) == (
        None, f"{name} is no longer an experiment class here: no defaults shown")
  assert _defaults("recorded_exps.Broken") == (
      None, "recorded_exps.Broken cannot be imported or configured here (ValueError: a bug "
      "since the run): no defaults shown")
  assert _defaults("failing_exps.Exp") == (
      None, "failing_exps.Exp cannot be imported or configured here (RuntimeError: cannot "
      "import me): no defaults shown")
