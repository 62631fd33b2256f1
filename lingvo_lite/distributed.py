"""Joining a multi-process (multi-host) run through JAX's own runtime, `jax.distributed`.

Every process runs the same command; process 0 also hosts the coordinator. On CPU the
collectives go through gloo. A process that stops sending heartbeats for
`heartbeat_timeout_seconds` is declared dead and the coordination service stops every other
process (JAX aborts them: exit code non-zero, never a silent hang).
"""

from __future__ import annotations

import os

import jax

from lingvo_lite.errors import UsageError


# Launchers JAX configures a process from: the variable with the number of processes, every
# variable JAX's detection reads (jax._src.clusters), and the command that sets them all.
_CLUSTERS = (
    ("SLURM", "SLURM_NTASKS",
     ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID"), "srun"),
    ("Open MPI", "OMPI_COMM_WORLD_SIZE",
     ("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
     "mpirun"),
)
_MAX_SECONDS = 2**31 - 1  # About 68 years; JAX's C++ runtime takes a C int of seconds.


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


def initialize(mode: str, coordinator_address: str | None, num_processes: int | None,
               process_id: int | None, heartbeat_timeout_seconds: int) -> str | None:
  """Calls jax.distributed.initialize when asked or detected (see `plan`); returns how, or
  None.

  Raises:
    UsageError: the flags or the launcher's environment cannot start a run (checked here, or
      refused by JAX before it connects). A coordinator that never answers is not one: JAX's
      runtime error propagates.
  """
  if not 1 <= heartbeat_timeout_seconds <= _MAX_SECONDS:
    # JAX's C++ runtime aborts the process on a negative timeout instead of raising.
    raise UsageError(f"--heartbeat_timeout_seconds={heartbeat_timeout_seconds}: must be in "
                     f"[1, {_MAX_SECONDS}] seconds (JAX's default is 100)")
  how = plan(mode, coordinator_address, num_processes, process_id)
  if how is None:
    return None
  # CPU processes exchange collectives through gloo (no effect on accelerators).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               heartbeat_timeout_seconds=heartbeat_timeout_seconds)
  except jax.errors.JaxRuntimeError:
    raise  # The runtime's own failures (connecting, timing out) are not the command's.
  except (ValueError, IndexError, TypeError, RuntimeError) as e:
    # What JAX checks before it connects: its arguments, or what it read from the
    # environment (for example an SLURM_JOB_ID that is not a number).
    text = " ".join(str(e).split())
    raise UsageError(f"--distributed: jax.distributed.initialize refused the setup ({how}): "
                     f"{type(e).__name__}: {text}; check --coordinator_address, "
                     "--num_processes and --process_id, or the launcher's environment "
                     "variables") from None
  return how
