"""The README's commands that stand alone (compiles, several processes, the bin/ tools, the
benches), run as written, in README order, with tests/test_readme.py's rules; a target of their
own beside that one's, so that neither is a long tail of the suite."""

import pytest

from tests import test_readme


@pytest.mark.slow
def test_standalone_readme_commands_run_as_written(tmp_path):
  commands = [c for c in test_readme.readme_commands(test_readme.README.read_text())
              if test_readme.standalone(c)]
  # Several processes, two compiles and the train that loads a saved step, two tools, benches.
  assert len(commands) >= 8, [c.text for c in commands]
  test_readme.run_readme_commands(tmp_path, test_readme.standalone)
