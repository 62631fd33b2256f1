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


# Imports the test suite's conftest as pytest would on a TPU machine, then starts a child.
_CHILDREN_PROBE = """
import os, subprocess, sys
import tests.conftest
import jax
print(jax.config.jax_platforms)
print(subprocess.run([sys.executable, "-c", "import jax; print(jax.config.jax_platforms)"],
                     capture_output=True, text=True, check=True).stdout.strip())
"""


def test_children_of_a_process_that_holds_the_chip_run_on_the_cpu():
  """bench/tpu_test_parts.py's CHILDREN_ON_CPU: the test process keeps the platforms it was
  given (the chip); a process it starts gets the CPU (a second process on a TPU fails)."""
  env = dict(os.environ, LINGVO_LITE_TEST_CHILDREN_ON_CPU="1", JAX_PLATFORMS="tpu,cpu")
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(testing.source_root()),
                                                    env.get("PYTHONPATH")]))
  completed = subprocess.run([sys.executable, "-c", _CHILDREN_PROBE], env=env,
                             cwd=testing.source_root(), capture_output=True, text=True,
                             timeout=300, check=False)
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert completed.stdout.splitlines() == ["tpu,cpu", "cpu"]
