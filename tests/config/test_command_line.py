"""The command-line contract: every spelling absl accepts takes effect in order; help flags;
--fdl_help; modes that take no config refuse config flags."""

import pytest

from lingvo_lite.testing import run_cli

PRINT = ["--mode=print", "--exp=PyCodeTiny"]


def _printed(result) -> dict[str, str]:
  assert result.code == 0, result.stderr
  fields = {}
  for line in result.stdout.splitlines():
    assignment = line.split("  #")[0]
    path, _, value = assignment.partition(" = ")
    fields[path.strip()] = value.strip()
  return fields


@pytest.mark.parametrize("spelling", [
    ["--fiddler=tiny"], ["--fiddler", "tiny"], ["-fiddler=tiny"], ["-fiddler", "tiny"],
])
def test_each_fiddler_spelling_changes_the_printed_config(spelling):
  assert _printed(run_cli(PRINT))["model.dim"] == "128"
  assert _printed(run_cli([*PRINT, *spelling]))["model.dim"] == "64"


@pytest.mark.parametrize("spelling", [
    ["--fdl.model.num_layers=3"], ["--fdl.model.num_layers", "3"], ["-fdl.model.num_layers=3"],
    ["--fdl_set=model.num_layers=3"], ["--fdl_set", "model.num_layers=3"],
    ["-fdl_set=model.num_layers=3"],
])
def test_each_set_spelling_changes_the_printed_config(spelling):
  fields = _printed(run_cli([*PRINT, *spelling]))
  assert fields["model.num_layers"] == "3"


def test_a_flagfile_applies_its_overrides_at_its_position(tmp_path):
  (tmp_path / "flags.txt").write_text("--fiddler=tiny\n--fdl.train.steps=7\n")
  # Before the flagfile: undone by its fiddler. After it: wins over the fiddler.
  fields = _printed(run_cli([*PRINT, "--fdl.model.dim=32", f"--flagfile={tmp_path}/flags.txt",
                             "--fdl.model.num_layers=3"]))
  assert (fields["model.dim"], fields["train.steps"], fields["model.num_layers"]) == (
      "64", "7", "3")
  text = run_cli([*PRINT, f"--flagfile={tmp_path}/flags.txt"]).stdout
  assert "train.steps = 7" in text and "# command line: --fdl.train.steps=7" in text


def test_help_shows_the_executor_flags_and_exits_0():
  for flag in ("--help", "-?", "--helpshort", "-h"):
    result = run_cli([flag])
    assert result.code == 0, (flag, result)
    for name in ("--job_log_dir", "--mode", "--exp", "--fiddler", "--fdl_config_file"):
      assert name in result.stdout, (flag, name)
  full = run_cli(["--helpfull"])
  assert full.code == 0 and "--verbosity" in full.stdout and "--job_log_dir" in full.stdout


def test_fdl_help_lists_fields_with_type_value_origin_doc_and_the_fiddlers():
  result = run_cli([*PRINT, "--fiddler=tiny", "--fdl_help"])
  assert result.code == 0, result.stderr
  out = result.stdout
  assert "  train.steps: int = 10    # command line: --fiddler=tiny" in out
  assert "Optimizer steps in the whole run" in out  # TrainLoop's Attributes: docstring.
  assert "  optimizer.b2: float = 0.95    # default" in out
  assert "Adam moments' decay rates and epsilon" in out  # An entry naming three fields.
  assert "  tiny: Shrinks any experiment" in out and "  synthetic_data: " in out
  # It describes the config; nothing is built or validated, so a broken value still shows.
  assert run_cli([*PRINT, "--fdl.model.num_heads=3", "--fdl_help"]).code == 0


def test_list_mode_refuses_config_flags_and_lists_without_them():
  result = run_cli(["--mode=list"])
  assert result.code == 0 and "lm.pycode.PyCodeTiny" in result.stdout
  refused = run_cli(["--mode=list", "--fiddler=tiny"])
  assert refused.code == 2 and "--mode=list takes no config" in refused.stderr
