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

CLUSTER_VARIABLES = ("SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID",
                     "SLURM_LOCALID", "OMPI_COMM_WORLD_SIZE", "OMPI_MCA_orte_hnp_uri",
                     "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                     "TPU_WORKER_HOSTNAMES")
# What srun and mpirun set (JAX's cluster detection reads all of them).
SLURM = {"SLURM_NTASKS": "8", "SLURM_JOB_ID": "123", "SLURM_STEP_NODELIST": "node[1-2]",
         "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
OPEN_MPI = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:4242",
            "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}


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


@pytest.mark.parametrize("environment, cluster", [
    (SLURM, "SLURM"),
    (OPEN_MPI, "Open MPI"),
    ({"TPU_WORKER_HOSTNAMES": "host0,host1"}, "TPU pod"),
])
def test_detected_cluster_lets_jax_fill_in_the_rest(calls, monkeypatch, environment, cluster):
  for variable, value in environment.items():
    monkeypatch.setenv(variable, value)
  assert distributed.initialize("auto", None, None, None, 30) == (
      f"auto-detected {cluster} environment")
  assert calls == [{"coordinator_address": None, "num_processes": None, "process_id": None,
                    "heartbeat_timeout_seconds": 30}]


@pytest.mark.parametrize("value", ["1", "", " "])
def test_one_task_or_an_empty_count_stays_single_process(calls, monkeypatch, value):
  for variable, text in SLURM.items():
    monkeypatch.setenv(variable, text)
  monkeypatch.setenv("SLURM_NTASKS", value)  # `SLURM_NTASKS= python ...` clears it.
  assert distributed.initialize("auto", None, None, None, 100) is None
  assert not calls


@pytest.mark.parametrize("environment, message", [
    ({"SLURM_NTASKS": "two"}, "environment variable SLURM_NTASKS='two': not an integer"),
    ({"SLURM_NTASKS": "2"}, "environment variable SLURM_NTASKS=2: says this is one of 2 SLURM "
     "processes, but SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_PROCID, SLURM_LOCALID are not "
     "set, so JAX cannot find the coordinator; start the processes with srun"),
    ({**OPEN_MPI, "OMPI_MCA_orte_hnp_uri": None}, "OMPI_COMM_WORLD_SIZE=2: says this is one "
     "of 2 Open MPI processes, but OMPI_MCA_orte_hnp_uri is not set"),
])
def test_a_broken_launcher_environment_is_one_usage_error(calls, monkeypatch, environment,
                                                          message):
  for variable, value in environment.items():
    if value is not None:
      monkeypatch.setenv(variable, value)
  for mode in ("auto", "on"):
    with pytest.raises(UsageError) as error:
      distributed.initialize(mode, None, None, None, 100)
    assert message in str(error.value) and "\n" not in str(error.value)
  assert distributed.initialize("off", None, None, None, 100) is None  # Never read.
  assert not calls


def test_what_jax_refuses_before_connecting_is_one_usage_error(monkeypatch, calls):
  del calls

  def refuse(**kwargs):
    raise ValueError("process_id and num_processes must be nonnegative,\nwith process_id < "
                     "num_processes.")
  monkeypatch.setattr(jax.distributed, "initialize", refuse)
  with pytest.raises(UsageError) as error:
    distributed.initialize("auto", "h:1", 2, 0, 100)
  assert str(error.value).startswith("--distributed: jax.distributed.initialize refused the "
                                     "setup (process 0 of 2 via h:1): ValueError: process_id "
                                     "and num_processes must be nonnegative, with process_id")

  def time_out(**kwargs):
    raise jax.errors.JaxRuntimeError("DEADLINE_EXCEEDED: Barrier timed out")
  monkeypatch.setattr(jax.distributed, "initialize", time_out)
  # A coordinator that never answers is a failure of the run, not of the command.
  with pytest.raises(jax.errors.JaxRuntimeError):
    distributed.initialize("auto", "h:1", 2, 0, 100)


def test_off_never_initializes(calls, monkeypatch):
  monkeypatch.setenv("SLURM_NTASKS", "8")
  assert distributed.initialize("off", None, None, None, 100) is None
  assert not calls


@pytest.mark.parametrize("mode, flags, message", [
    ("auto", ("h:1", 2, None), "--coordinator_address, --num_processes and --process_id go "
                               "together; got 'h:1', 2, None"),
    ("auto", ("h:1", 2, 2), "--process_id=2: must be in [0, --num_processes=2)"),
    ("off", ("h:1", 2, 0), "--distributed=off: conflicts with"),
    ("auto", ("h:1", 0, 0), "--num_processes=0: must be a positive integer"),
    ("auto", ("localhost", 1, 0), "--coordinator_address=localhost: expected HOST:PORT"),
    ("auto", (":1234", 1, 0), "--coordinator_address=:1234: expected HOST:PORT"),
    ("auto", ("h:99999", 1, 0), "with a port in 1..65535"),
    ("auto", ("h:0", 1, 0), "with a port in 1..65535"),
    ("auto", ("h:port", 1, 0), "with a port in 1..65535"),
])
def test_inconsistent_flags_are_one_usage_error(calls, mode, flags, message):
  with pytest.raises(UsageError) as error:
    distributed.initialize(mode, *flags, 100)
  assert message in str(error.value) and "\n" not in str(error.value)
  assert not calls


@pytest.mark.parametrize("seconds", [-1, 0, 2**31])
def test_a_heartbeat_timeout_jax_would_abort_on_is_one_usage_error(calls, seconds):
  with pytest.raises(UsageError, match=rf"--heartbeat_timeout_seconds={seconds}: must be in "
                                       r"\[1, 2147483647\] seconds"):
    distributed.initialize("auto", "h:1", 2, 0, seconds)
  assert not calls
  assert distributed.initialize("auto", "[::1]:1234", 2, 1, 1) == "process 1 of 2 via [::1]:1234"


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
    ([], SLURM, True),
    (["--distributed=off"], SLURM, False),
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
