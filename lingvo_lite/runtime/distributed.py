"""Joining a multi-process (multi-host) run through JAX's own runtime, `jax.distributed`.

Every process runs the same command; process 0 also hosts the coordinator. On CPU the
collectives go through gloo. A process that stops sending heartbeats for
`heartbeat_timeout_seconds` is declared dead and the coordination service stops every other
process (JAX aborts them: exit code non-zero, never a silent hang).

At start-up every process waits until all have joined. JAX would wait in silence and then
abort with a C++ stack trace; here a waiting process says every few seconds what it waits for,
and after `init_timeout_seconds` gives up with one line and exit code 1 (`_StartupWait`).

Longer than 300 lines with a reason: planning how a process joins, checking the cluster's settings
and waiting for the others (`_StartupWait`, with its watching thread and Ctrl-C handling) are the
steps of one call, `initialize`, and share its one-line messages.
"""

from __future__ import annotations

import errno
import os
import re
import select
import signal
import socket
import sys
import threading
import time

import jax

from lingvo_lite.errors import UsageError, message_of


# Launchers JAX configures a process from: the variable with the number of processes, every
# variable JAX's detection reads (jax._src.clusters), and the command that sets them all.
_CLUSTERS = (
    ("SLURM", "SLURM_NTASKS",
     ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID"), "srun"),
    ("Open MPI", "OMPI_COMM_WORLD_SIZE",
     ("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
     "mpirun"),
)
# What gloo (the CPU collectives) says in a survivor when a peer process died in the middle of a
# collective: in the runtime's log, and in the JaxRuntimeError the collective raises.
PEER_CLOSED = re.compile(r"Gloo.*(Connection closed by peer|Connection reset by peer)")
PEER_CLOSED_MESSAGE = ("a peer process closed its connection in the middle of a collective (it "
                       "crashed or was killed), so this one stopped; restart every process to "
                       "resume from the last checkpoint")


def lost_peer(error: BaseException) -> str | None:
  """The one line for an error a collective raised because a peer process died (the cause,
  not a traceback of where this process was waiting for it), or None for any other error."""
  return PEER_CLOSED_MESSAGE if PEER_CLOSED.search(message_of(error)) else None


_MAX_SECONDS = 2**31 - 1  # About 68 years; JAX's C++ runtime takes a C int of seconds.
DEFAULT_INIT_TIMEOUT_SECONDS = 300  # JAX's own.
# A process that waits longer than this for the others to join says so, then again this often.
FIRST_WAIT_REPORT_SECONDS = 3.0
WAIT_REPORT_SECONDS = 10.0
# JAX's own start-up deadline, past ours: its expiry is an abort with a C++ stack trace, ours
# is one line.
_JAX_DEADLINE_MARGIN_SECONDS = 60


def _env_int(name: str) -> int | None:
  """An integer environment variable; unset and empty (`NAME= cmd`) both mean None."""
  text = os.environ.get(name, "").strip()
  if not text:
    return None
  try:
    return int(text)
  except ValueError:
    raise UsageError(f"environment variable {name}={text!r}: not an integer; unset it, or fix "
                     "the launcher that set it") from None


def detected_cluster() -> str | None:
  """The multi-process launcher JAX can configure itself from, if this process runs under one
  (with more than one process)."""
  for name, size_variable, needed, _ in _CLUSTERS:
    if (_env_int(size_variable) or 1) > 1 and all(v in os.environ for v in needed):
      return name
  if "," in os.environ.get("TPU_WORKER_HOSTNAMES", ""):
    return "TPU pod"
  return None


def _check_cluster_environment() -> None:
  """A launcher's process count without the rest of its variables (a hand-set SLURM_NTASKS,
  a shell inside `salloc`): this is one of several processes, but JAX could not find the
  coordinator or this process's index."""
  for name, size_variable, needed, launcher in _CLUSTERS:
    size = _env_int(size_variable)
    missing = [v for v in needed if v not in os.environ]
    if size is not None and size > 1 and missing:
      raise UsageError(
          f"environment variable {size_variable}={size}: says this is one of {size} {name} "
          f"processes, but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
          f"set, so JAX cannot find the coordinator; start the processes with {launcher}, "
          "pass --coordinator_address, --num_processes and --process_id, or run alone with "
          "--distributed=off")


def _check_address(address: str) -> None:
  """HOST:PORT, as JAX needs it (it takes the port after the last colon; `[::1]:80` works)."""
  host, colon, port = address.rpartition(":")
  if not (colon and host and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
    raise UsageError(f"--coordinator_address={address}: expected HOST:PORT, the address of "
                     "process 0 with a port in 1..65535, e.g. 10.0.0.1:1234")


def plan(mode: str, coordinator_address: str | None, num_processes: int | None,
         process_id: int | None) -> str | None:
  """How this process would join a multi-process run (None: it runs alone), from the flags.

  Checked before anything else happens (before a supervising parent starts a child, too), so
  inconsistent flags are one line.

  Args:
    mode: "auto" (explicit flags or a detected cluster), "on" (always), "off" (never).

  Raises:
    UsageError: the flags contradict each other or cannot start a run.
  """
  explicit = (coordinator_address, num_processes, process_id)
  if mode == "off":
    if any(v is not None for v in explicit):
      raise UsageError("--distributed=off: conflicts with --coordinator_address/"
                       "--num_processes/--process_id; drop one or the other")
    return None
  if any(v is not None for v in explicit):
    if None in explicit:
      raise UsageError("--coordinator_address, --num_processes and --process_id go together; "
                       f"got {coordinator_address!r}, {num_processes!r}, {process_id!r}")
    if num_processes < 1:
      raise UsageError(f"--num_processes={num_processes}: must be a positive integer")
    if not 0 <= process_id < num_processes:
      raise UsageError(f"--process_id={process_id}: must be in [0, --num_processes="
                       f"{num_processes})")
    _check_address(coordinator_address)
    return f"process {process_id} of {num_processes} via {coordinator_address}"
  _check_cluster_environment()
  cluster = detected_cluster()
  if cluster is None and mode == "auto":
    return None
  if cluster is None:
    # jax.distributed.initialize() would fail deep in its cluster detection instead.
    raise UsageError("--distributed=on: no --coordinator_address/--num_processes/"
                     "--process_id given and no SLURM, Open MPI or TPU pod environment "
                     "detected; pass all three flags, or drop --distributed=on")
  return f"auto-detected {cluster} environment"


def check_timeouts(heartbeat_timeout_seconds: int, init_timeout_seconds: int) -> None:
  """Refuses timeouts JAX's C++ runtime cannot take: it aborts the process on a negative one
  instead of raising, and takes a C int of seconds (with our margin added, for the start-up).

  Raises:
    UsageError: a timeout out of range.
  """
  if not 1 <= heartbeat_timeout_seconds <= _MAX_SECONDS:
    raise UsageError(f"--heartbeat_timeout_seconds={heartbeat_timeout_seconds}: must be in "
                     f"[1, {_MAX_SECONDS}] seconds (JAX's default is 100)")
  longest = _MAX_SECONDS - _JAX_DEADLINE_MARGIN_SECONDS
  if not 1 <= init_timeout_seconds <= longest:
    raise UsageError(f"--distributed_init_timeout_seconds={init_timeout_seconds}: must be in "
                     f"[1, {longest}] seconds (the default is {DEFAULT_INIT_TIMEOUT_SECONDS})")


class StartupFailure(RuntimeError):
  """JAX's runtime could not start or join the run (exit code 1); the message is one line."""


def _check_coordinator_port(address: str, num_processes: int | None) -> None:
  """Process 0 binds the coordinator's port on every interface; a port another program
  listens on is refused here, in one line: JAX would fail there with its C++ log, and at times
  crash (a segmentation fault inside its runtime).

  Raises:
    StartupFailure: the port is in use (other errors are left for JAX to meet).
  """
  port = int(address.rpartition(":")[2])
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    # Not over a listening socket, but over the TIME_WAIT leftovers of a finished run, as JAX.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(("", port))
    except OSError as e:
      if e.errno != errno.EADDRINUSE:
        return
      raise StartupFailure(
          f"jax.distributed: process 0 of {num_processes} could not start its coordinator at "
          f"{address}: port {port} is in use by another program (EADDRINUSE), maybe another "
          "run; stop it, or give --coordinator_address another port (the same to every "
          "process)") from None


def _startup_failure(error: Exception, coordinator_address: str | None,
                     num_processes: int | None, process_id: int | None, how: str) -> str:
  """The one line for a runtime error of jax.distributed.initialize: who failed at what, the
  runtime's first line, and the fix."""
  lines = str(error).strip().splitlines()
  cause = " ".join(lines[0].split()) if lines else type(error).__name__
  if process_id == 0:
    return (f"jax.distributed: process 0 of {num_processes} could not start its coordinator "
            f"at {coordinator_address} ({cause}); check that its port is free on this machine "
            "(another run may hold it) and the address is this machine's, or give "
            "--coordinator_address another port")
  who = (f"process {process_id} of {num_processes}" if process_id is not None
         else f"this process ({how})")
  return (f"jax.distributed: {who} could not join the run ({cause}); check that every process "
          "started (the same --coordinator_address and --num_processes, each its own "
          "--process_id) and can reach the coordinator")


def initialize(mode: str, coordinator_address: str | None, num_processes: int | None,
               process_id: int | None, heartbeat_timeout_seconds: int,
               init_timeout_seconds: int = DEFAULT_INIT_TIMEOUT_SECONDS) -> str | None:
  """Calls jax.distributed.initialize when asked or detected (see `plan`); returns how, or
  None.

  While the other processes have not all joined, a line on stderr every few seconds says what
  this one waits for; after `init_timeout_seconds` it prints one line and exits with code 1
  (from a watching thread: JAX waits inside C++, where Python cannot interrupt it).

  Raises:
    UsageError: the flags or the launcher's environment cannot start a run (checked here, or
      refused by JAX before it connects).
    StartupFailure: JAX's runtime failed to start or join the run.
  """
  check_timeouts(heartbeat_timeout_seconds, init_timeout_seconds)
  how = plan(mode, coordinator_address, num_processes, process_id)
  if how is None:
    return None
  if process_id == 0 and coordinator_address is not None:
    _check_coordinator_port(coordinator_address, num_processes)
  # CPU processes exchange collectives through gloo (no effect on accelerators).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    with _StartupWait(how, coordinator_address, num_processes, process_id,
                      init_timeout_seconds):
      jax.distributed.initialize(
          coordinator_address=coordinator_address, num_processes=num_processes,
          process_id=process_id, heartbeat_timeout_seconds=heartbeat_timeout_seconds,
          initialization_timeout=init_timeout_seconds + _JAX_DEADLINE_MARGIN_SECONDS)
  except jax.errors.JaxRuntimeError as e:
    # The runtime's own failures (a coordinator port another process holds, a connection
    # refused) are the run's, not the command's: exit 1.
    raise StartupFailure(_startup_failure(e, coordinator_address, num_processes, process_id,
                                          how)) from None
  except (ValueError, IndexError, TypeError, RuntimeError) as e:
    # What JAX checks before it connects: its arguments, or what it read from the
    # environment (for example an SLURM_JOB_ID that is not a number).
    text = " ".join(str(e).split())
    raise UsageError(f"--distributed: jax.distributed.initialize refused the setup ({how}): "
                     f"{type(e).__name__}: {text}; check --coordinator_address, "
                     "--num_processes and --process_id, or the launcher's environment "
                     "variables") from None
  return how


class _StartupWait:
  """Watches a process waiting for the others to join, from a thread of its own.

  The main thread waits inside JAX's C++ code, where no Python signal handler runs: Ctrl-C
  would do nothing until the wait ends. Python's C-level handler still writes the signal's
  number to the wakeup file descriptor (`signal.set_wakeup_fd`), which the watching thread
  reads, so SIGINT stops the wait at once (exit code 130, the shell's for SIGINT).

  Args:
    how: How the process joins (`plan`), for a run whose launcher JAX reads.
    coordinator_address, num_processes, process_id: As given; None when JAX detects them (it
      records what it found before it starts waiting, which is read then).
    timeout_seconds: When to give up.
  """

  def __init__(self, how: str, coordinator_address: str | None, num_processes: int | None,
               process_id: int | None, timeout_seconds: int):
    self._how = how
    self._given = (coordinator_address, num_processes, process_id)
    self._timeout = timeout_seconds
    self._joined = threading.Event()
    self._thread = threading.Thread(target=self._watch, name="distributed-startup-wait",
                                    daemon=True)
    self._start = 0.0
    self._wakeup, self._wake = os.pipe()  # Signal numbers, or a byte from __exit__.
    os.set_blocking(self._wake, False)
    self._previous_wakeup: int | None = None

  def __enter__(self) -> "_StartupWait":
    try:
      self._previous_wakeup = signal.set_wakeup_fd(self._wake)
    except ValueError:
      pass  # Not the main thread: it gets no signals to watch for.
    self._start = time.monotonic()
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    if self._previous_wakeup is not None:
      signal.set_wakeup_fd(self._previous_wakeup)
    self._joined.set()
    os.write(self._wake, b"\0")
    self._thread.join()
    os.close(self._wakeup)
    os.close(self._wake)

  def _watch(self) -> None:
    deadline = self._start + self._timeout
    report_at = self._start + FIRST_WAIT_REPORT_SECONDS
    while True:
      timeout = max(0.0, min(report_at, deadline) - time.monotonic())
      if select.select([self._wakeup], [], [], timeout)[0]:
        received = os.read(self._wakeup, 64)
        if self._joined.is_set():
          return
        if signal.SIGINT in received:
          subject, awaited = self._waiting_for()
          self._exit(f"lingvo_lite: {subject} stopped by SIGINT while waiting for {awaited}",
                     128 + signal.SIGINT)
          return
        continue  # Another signal: its handler runs once the wait ends.
      now = time.monotonic()
      subject, awaited = self._waiting_for()
      if now >= deadline:
        self._exit(f"lingvo_lite: error: jax.distributed: {subject} gave up after "
                   f"{self._timeout} s waiting for {awaited}; check that every process started "
                   "(the same --coordinator_address and --num_processes, each its own "
                   "--process_id) and can reach the coordinator, or wait longer with "
                   "--distributed_init_timeout_seconds", 1)
        return
      print(f"jax.distributed: {subject} waiting for {awaited} ({now - self._start:.0f} s so "
            f"far; gives up after {self._timeout} s, --distributed_init_timeout_seconds)",
            file=sys.stderr, flush=True)
      report_at = now + WAIT_REPORT_SECONDS

  @staticmethod
  def _exit(line: str, code: int) -> None:
    """Prints `line` and ends the process: the main thread is inside JAX's C++ wait, which no
    exception reaches. (Returns where a test replaced os._exit.)"""
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)  # pylint: disable=protected-access

  def _waiting_for(self) -> tuple[str, str]:
    """(this process, what it waits for), e.g. ("process 1 of 2", "the coordinator at ...")."""
    address, count, index = self._given
    try:  # What JAX detected (a launcher's run), recorded before it waits.
      from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
      state = jax_distributed.global_state
    except (ImportError, AttributeError):
      state = None
    found = vars(state) if state is not None else {}  # Set ones only: not the class defaults.
    address = address or found.get("coordinator_address")
    count = count if count is not None else found.get("num_processes")
    index = index if index is not None else found.get("process_id")
    if None in (address, count, index):
      return "this process", f"the others to join the run ({self._how})"
    if index == 0:
      return (f"process 0 of {count}",
              f"the other processes to join its coordinator at {address}")
    return (f"process {index} of {count}",
            f"the coordinator at {address} (process 0) and the other processes to join")
