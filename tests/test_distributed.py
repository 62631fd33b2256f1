"""When the executor joins a multi-process run (explicit flags, a detected cluster, or never),
and what its supervising parent makes of a survivor's log.

jax.distributed.initialize is replaced by a recorder: what matters here is whether it is called
and with what (the real multi-process path, dead peer included, is tests/test_multiprocess.py).
"""

import jax
import pytest
from absl import flags

from lingvo_lite import distributed, executor, supervisor
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


# What the coordination service printed in a survivor when process 1 was killed (abridged).
HEARTBEAT_LOG_MULTILINE = """\
E1130 06:25:26.878805 13382 coordination_service.cc:1549] Use error polling to propagate the \
following error to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending \
heartbeats):
1
The tasks have crashed. Check the task logs for an earlier error.
F1130 06:25:26.880194 13393 client.h:80] Terminating process because the JAX distributed \
service detected fatal errors.
"""
HEARTBEAT_LOG_INLINE = """\
Barrier result: 'INTERNAL: Barrier failed because: task is set to ERROR: UNAVAILABLE: Task 3 \
heartbeat timeout. This indicates that the remote task has failed, got preempted, or crashed.
"""
GLOO_LOG = """\
Traceback (most recent call last):
jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/\
tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:59055
"""


def _watch(log):
  watch = supervisor.LogWatch()
  for line in log.splitlines(keepends=True):
    watch.feed(line)
  return watch


def test_log_watch_names_the_process_that_stopped_sending_heartbeats():
  assert _watch(HEARTBEAT_LOG_MULTILINE).missing_processes == {"1"}
  assert _watch(HEARTBEAT_LOG_INLINE).missing_processes == {"3"}
  both = _watch(GLOO_LOG + HEARTBEAT_LOG_MULTILINE + HEARTBEAT_LOG_INLINE).verdict()
  assert both.startswith("lingvo_lite: error: process 1, 3 of this jax.distributed run stopped "
                         "sending heartbeats") and "\n" not in both
  # "1" on a line of its own counts only right after the line that announces the ids.
  assert _watch("step\n1\n").missing_processes == set()


def test_log_watch_falls_back_to_the_closed_connection_and_else_stays_silent():
  assert _watch(GLOO_LOG).verdict().startswith(
      "lingvo_lite: error: a peer process closed its connection in the middle of a collective")
  assert _watch("Traceback (most recent call last):\nValueError: boom\n").verdict() is None
  # A reset connection outside a collective (a storage read, say) is not a dead peer.
  assert _watch("OSError: [Errno 104] Connection reset by peer\n").verdict() is None


@pytest.mark.parametrize("args, environment, expected", [
    (["--exp=X"], {}, False),
    (["--coordinator_address=h:1", "--num_processes=2", "--process_id=0"], {}, True),
    (["-coordinator_address", "h:1", "--num_processes=2", "--process_id=0"], {}, True),
    (["--distributed=on"], {}, True),
    (["--distributed", "on"], {}, True),
    ([], {"SLURM_NTASKS": "4"}, True),
    (["--distributed=off"], {"SLURM_NTASKS": "4"}, False),
    (["--coordinator_address=h:1"], {supervisor.CHILD_ENV: "4242"}, False),
    (["--flagfile={tmp}/flags"], {}, True),
])
def test_supervisor_wraps_only_processes_of_a_multi_process_run(monkeypatch, tmp_path, args,
                                                                environment, expected):
  """Decided from the flags as absl parsed them: every spelling counts, a flagfile too."""
  for name in (*CLUSTER_VARIABLES, supervisor.CHILD_ENV):
    monkeypatch.delenv(name, raising=False)
  for name, value in environment.items():
    monkeypatch.setenv(name, value)
  (tmp_path / "flags").write_text("--coordinator_address=h:1\n")
  flags.FLAGS.unparse_flags()
  try:
    executor.parse_flags(["lingvo_lite", *(a.format(tmp=tmp_path) for a in args)])
    assert supervisor.wanted(flags.FLAGS.distributed, flags.FLAGS.coordinator_address) == \
        expected
  finally:
    flags.FLAGS.unparse_flags()
