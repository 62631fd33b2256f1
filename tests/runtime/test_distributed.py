"""When the executor joins a multi-process run (explicit flags, a detected cluster, or never),
and what its supervising parent makes of a survivor's log.

jax.distributed.initialize is replaced by a recorder: what matters here is whether it is called
and with what (the real multi-process path, dead peer included, is tests/runtime/test_multiprocess.py).
"""

import os
import signal
import socket
import threading
import time

import jax
import pytest
from absl import flags

from lingvo_lite import executor
from lingvo_lite.errors import UsageError
from lingvo_lite.runtime import distributed, supervisor
from lingvo_lite.testing import run_cli

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
                    "process_id": 3, "heartbeat_timeout_seconds": 15,
                    "initialization_timeout": 300 + 60}]  # JAX's abort comes after our line.


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
                    "heartbeat_timeout_seconds": 30, "initialization_timeout": 360}]


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
  # A coordinator that never answers is a failure of the run, not of the command: one line.
  with pytest.raises(distributed.StartupFailure, match="^jax.distributed: process 1 of 2 "
                     r"could not join the run \(DEADLINE_EXCEEDED: Barrier timed out\); "):
    distributed.initialize("auto", "h:1", 2, 1, 100)


def test_a_coordinator_port_another_process_holds_is_one_line(calls):
  """Process 0 cannot start its coordinator where another program listens: one line (exit 1
  in the executor), found before JAX, whose runtime would fail there with its C++ log, and at
  times crash."""
  with socket.socket() as held:
    held.bind(("127.0.0.1", 0))
    held.listen()
    address = f"127.0.0.1:{held.getsockname()[1]}"
    with pytest.raises(distributed.StartupFailure) as failure:
      distributed.initialize("on", address, 2, 0, 100)
  assert str(failure.value) == (
      f"jax.distributed: process 0 of 2 could not start its coordinator at {address}: port "
      f"{address.rpartition(':')[2]} is in use by another program (EADDRINUSE), maybe another "
      "run; stop it, or give --coordinator_address another port (the same to every process)")
  assert not calls  # JAX was never asked.


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


def test_a_process_that_joins_at_once_says_nothing(calls, capsys):
  assert distributed.initialize("auto", "10.0.0.1:1234", 4, 3, 15, 1)
  assert capsys.readouterr().err == ""


def test_a_process_waiting_to_join_says_so_then_gives_up_in_one_line(calls, monkeypatch, capsys):
  """JAX waits inside C++ (and, at its own deadline, aborts with a stack trace): a watching
  thread reports, then ends the process (os._exit here recorded, and the wait let go)."""
  joined, exits = threading.Event(), []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **_: joined.wait(30))
  monkeypatch.setattr(distributed.os, "_exit", lambda code: (exits.append(code), joined.set()))
  monkeypatch.setattr(distributed, "FIRST_WAIT_REPORT_SECONDS", 0.2)
  monkeypatch.setattr(distributed, "WAIT_REPORT_SECONDS", 0.3)
  started = time.monotonic()
  distributed.initialize("auto", "10.0.0.1:1234", 4, 3, 100, 1)
  assert exits == [1] and 1 <= time.monotonic() - started < 5
  lines = capsys.readouterr().err.splitlines()
  assert len(lines) >= 3, lines  # At 0.2 s, 0.5 s, 0.8 s; then the last line at 1 s.
  assert lines[0] == ("jax.distributed: process 3 of 4 waiting for the coordinator at "
                      "10.0.0.1:1234 (process 0) and the other processes to join (0 s so far; "
                      "gives up after 1 s, --distributed_init_timeout_seconds)")
  assert lines[-1] == (
      "lingvo_lite: error: jax.distributed: process 3 of 4 gave up after 1 s waiting for the "
      "coordinator at 10.0.0.1:1234 (process 0) and the other processes to join; check that "
      "every process started (the same --coordinator_address and --num_processes, each its own "
      "--process_id) and can reach the coordinator, or wait longer with "
      "--distributed_init_timeout_seconds")


def test_ctrl_c_stops_the_wait_at_once(calls, monkeypatch, capsys):
  """No Python handler runs while the main thread waits in C++; the watching thread sees the
  signal through the wakeup fd. (This test's own handler keeps pytest running.)"""
  joined, exits = threading.Event(), []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **_: joined.wait(30))
  monkeypatch.setattr(distributed.os, "_exit", lambda code: (exits.append(code), joined.set()))
  previous = signal.signal(signal.SIGINT, lambda *_: None)
  try:
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    distributed.initialize("auto", "10.0.0.1:1234", 4, 0, 100, 20)
  finally:
    signal.signal(signal.SIGINT, previous)
  assert exits == [130]
  assert capsys.readouterr().err.splitlines() == [
      "lingvo_lite: process 0 of 4 stopped by SIGINT while waiting for the other processes to "
      "join its coordinator at 10.0.0.1:1234"]


@pytest.mark.parametrize("seconds", [0, -5, 2**31 - 60])
def test_a_start_up_timeout_out_of_range_is_one_usage_error(calls, seconds):
  with pytest.raises(UsageError, match=rf"^--distributed_init_timeout_seconds={seconds}: must be "
                                       r"in \[1, 2147483587\] seconds \(the default is 300\)$"):
    distributed.initialize("auto", "h:1", 2, 0, 100, seconds)
  assert not calls


# A survivor's stderr when its peer was killed (jaxlib 0.10, abridged), with Python's own output
# around it: (seconds since the start, line).
SURVIVOR_STDERR = [
    (0.0, "eval validation: 12/40 batches (30%), 1.2 s, ETA 2.8 s\n"),
    (9.0, "E1202 05:55:27.314021    8637 coordination_service.cc:1549] Use error polling to "
          "propagate the following error to all tasks: UNAVAILABLE: The following tasks are "
          "unhealthy (stopped sending heartbeats):\n"),
    (9.0, "1\n"),
    (9.0, "The tasks have crashed. Check the task logs for an earlier error.\n"),
    (9.0, "W1202 05:55:27.314100 140234 train.py:80] a Python module's absl log\n"),
    (9.1, "E1202 05:55:27.314501    8648 coordination_service_agent.cc:289] Polled an error\n"),
    (9.1, "F1202 05:55:27.314628    8648 client.h:80] Terminating process because the JAX "
          "distributed service detected fatal errors. absl::Status: UNAVAILABLE: The following "
          "tasks are unhealthy (stopped sending heartbeats):\n"),
    (9.1, "1\n"),
    (9.1, "\n"),
    (9.1, "RPC: /xla.coordination.CoordinationService/PollForError\n"),
    (9.1, "*** Check failure stack trace: ***\n"),
    (9.1, "    @     0x7f843da40634  absl::log_internal::LogMessage::SendToLog()\n"),
    (9.1, "Traceback (most recent call last):\n"),
    (9.1, "    @     0x7f8444ea71f5  PyObject_Vectorcall\n"),
    # faulthandler at the abort: Python's view of the runtime's death, not Python's error.
    (9.1, "Fatal Python error: Aborted\n"),
    (9.1, "\n"),
    (9.1, "Thread 0x00007f8dfe9846c0 (most recent call first):\n"),
    (9.1, '  File "/work/main/lingvo_lite/data/prefetch.py", line 33 in produce\n'),
    (9.1, "Extension modules: jaxlib.cpu_feature_guard, numpy.linalg (total: 2)\n"),
    # A stack dump the user asked for (SIGUSR1), and its lines.
    (9.2, "lingvo_lite stack dump: SIGUSR1 (kill -USR1 42)\n"),
    (9.2, "Thread 0x00007f8dfe9846c0 (most recent call first):\n"),
    (9.3, "    @     0x7f8444ea71f5  (unknown)"),
]
PASSED = {0, 4, 12, 19, 20}  # The indices of the lines that are Python's.


def test_the_runtime_log_is_held_and_python_output_passes():
  runtime_log = supervisor.RuntimeLog()
  passed = [i for i, (when, line) in enumerate(SURVIVOR_STDERR)
            if not runtime_log.holds(line.encode(), when)]
  assert passed == sorted(PASSED)
  held = [line for i, (_, line) in enumerate(SURVIVOR_STDERR) if i not in PASSED]
  assert runtime_log.release().decode() == (
      "lingvo_lite: the JAX runtime's log (held back while the run went on):\n"
      + "".join(held) + "\n")
  assert runtime_log.release() == b""
  # A line long after a record is no continuation of it.
  assert runtime_log.holds(b"E1202 05:55:27.314021 1 a.cc:1] x\n", 0.0)
  assert not runtime_log.holds(b"loss 2.5\n", 5.0)


def test_the_runtime_log_keeps_its_last_lines():
  runtime_log = supervisor.RuntimeLog(limit=2)
  for i in range(5):
    assert runtime_log.holds(f"E1202 05:55:27.314021 1 a.cc:{i}] x\n".encode(), 10.0 * i)
  assert runtime_log.release() == (
      b"lingvo_lite: the JAX runtime's log (held back while the run went on, its first 3 lines "
      b"left out):\nE1202 05:55:27.314021 1 a.cc:3] x\nE1202 05:55:27.314021 1 a.cc:4] x\n")


def test_a_peer_lost_in_the_middle_of_a_collective_is_one_line_not_a_traceback(monkeypatch):
  """gloo raises a JaxRuntimeError in the survivor whose peer died mid-collective; the run
  ends with the cause in one line, exit 1. Other errors are not taken for it."""
  from lingvo_lite.programs import list_experiments  # pylint: disable=import-outside-toplevel
  lost = jax.errors.JaxRuntimeError(
      "INTERNAL: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:534] Read "
      "error [127.0.0.1]:41000: Connection reset by peer")
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(list_experiments, "main", lambda invocation: (_ for _ in ()).throw(lost))
  result = run_cli(["--mode=list"])
  assert result.code == 1, result
  assert result.stderr.splitlines() == [
      f"lingvo_lite: error: {distributed.PEER_CLOSED_MESSAGE}"], result.stderr
  assert distributed.lost_peer(jax.errors.JaxRuntimeError("INTERNAL: out of memory")) is None
