"""When the executor joins a multi-process run: explicit flags, a detected cluster, or never.

jax.distributed.initialize is replaced by a recorder: what matters here is whether it is called
and with what (the real multi-process path is tests/test_multiprocess.py).
"""

import jax
import pytest

from lingvo_lite import distributed
from lingvo_lite.errors import UsageError

CLUSTER_VARIABLES = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES")


@pytest.fixture(name="calls")
def fixture_calls(monkeypatch):
  for name in CLUSTER_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  recorded = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: recorded.append(kwargs))
  monkeypatch.setattr(jax.config, "update", lambda *args: None)  # Keep this process's config.
  return recorded


def test_single_process_by_default(calls):
  assert distributed.initialize("auto", None, None, None, 100) is None
  assert not calls


def test_explicit_flags_are_passed_through(calls):
  how = distributed.initialize("auto", "10.0.0.1:1234", 4, 3, 15)
  assert how == "process 3 of 4 via 10.0.0.1:1234"
  assert calls == [{"coordinator_address": "10.0.0.1:1234", "num_processes": 4,
                    "process_id": 3, "heartbeat_timeout_seconds": 15}]


@pytest.mark.parametrize("variable, value, cluster", [
    ("SLURM_NTASKS", "8", "SLURM"),
    ("OMPI_COMM_WORLD_SIZE", "2", "Open MPI"),
    ("TPU_WORKER_HOSTNAMES", "host0,host1", "TPU pod"),
])
def test_detected_cluster_lets_jax_fill_in_the_rest(calls, monkeypatch, variable, value, cluster):
  monkeypatch.setenv(variable, value)
  assert distributed.initialize("auto", None, None, None, 30) == (
      f"auto-detected {cluster} environment")
  assert calls == [{"coordinator_address": None, "num_processes": None, "process_id": None,
                    "heartbeat_timeout_seconds": 30}]


def test_one_task_slurm_job_stays_single_process(calls, monkeypatch):
  monkeypatch.setenv("SLURM_NTASKS", "1")
  assert distributed.initialize("auto", None, None, None, 100) is None
  assert not calls


def test_off_never_initializes(calls, monkeypatch):
  monkeypatch.setenv("SLURM_NTASKS", "8")
  assert distributed.initialize("off", None, None, None, 100) is None
  assert not calls


@pytest.mark.parametrize("mode, flags, message", [
    ("auto", ("h:1", 2, None), "--coordinator_address, --num_processes and --process_id go "
                               "together; got 'h:1', 2, None"),
    ("auto", ("h:1", 2, 2), "--process_id=2: must be in [0, --num_processes=2)"),
    ("off", ("h:1", 2, 0), "--distributed=off: conflicts with"),
])
def test_inconsistent_flags_are_one_usage_error(calls, mode, flags, message):
  with pytest.raises(UsageError) as error:
    distributed.initialize(mode, *flags, 100)
  assert message in str(error.value) and "\n" not in str(error.value)
  assert not calls
