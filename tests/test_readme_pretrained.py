"""The README's commands of the pretrained model (SmolLM2-135M: decode, eval, fine-tune, export),
run as written, in README order, with tests/test_readme.py's rules; a target of their own, beside
that one's (each reads 135M parameters: together they would make one long critical path)."""

import pytest

from tests import test_readme


@pytest.mark.slow
def test_pretrained_readme_commands_run_as_written(tmp_path):
  commands = [c for c in test_readme.readme_commands(test_readme.README.read_text())
              if test_readme._pretrained(c)]  # pylint: disable=protected-access
  assert len(commands) >= 4, [c.text for c in commands]  # Decode, eval, fine-tune, export.
  test_readme.run_readme_commands(
      tmp_path, test_readme._pretrained)  # pylint: disable=protected-access
