"""lingvo_lite.testing is importable without the command line's flags: a library test or a tool
with flags of its own may use its tiny setups, and only the helpers that run the executor
import it (and so define its flags)."""

import os
import subprocess
import sys

from lingvo_lite import testing

# Prints which of the executor's flags absl knows, and whether the executor was imported.
_PROBE = """
import sys
from absl import flags
import {module}
print(sorted(name for name in ("exp", "mode", "job_log_dir") if name in flags.FLAGS))
print("lingvo_lite.executor" in sys.modules)
"""


def _probe(module: str) -> list[str]:
  """A fresh interpreter's answer to _PROBE: this process has long imported the executor."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(testing.source_root()),
                                                    env.get("PYTHONPATH")]))
  completed = subprocess.run([sys.executable, "-c", _PROBE.format(module=module)], env=env,
                             capture_output=True, text=True, timeout=300, check=False)
  assert completed.returncode == 0, completed.stderr[-3000:]
  return completed.stdout.splitlines()


def test_importing_testing_defines_none_of_the_executors_flags():
  assert _probe("lingvo_lite.testing") == ["[]", "False"]


def test_the_probe_sees_the_flags_once_the_executor_is_imported():
  # The control: the same probe, after importing the executor, finds its flags.
  assert _probe("lingvo_lite.executor") == ["['exp', 'job_log_dir', 'mode']", "True"]


def test_run_cli_still_runs_the_executor():
  result = testing.run_cli(["--mode=list"])
  assert result.code == 0, result.stderr[-2000:]
  assert "PyCodeTiny" in result.stdout
