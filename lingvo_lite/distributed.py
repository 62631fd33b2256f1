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


def detected_cluster() -> str | None:
  """The multi-process launcher JAX can configure itself from, if this process runs under one."""
  if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
    return "SLURM"
  if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
    return "Open MPI"
  if "," in os.environ.get("TPU_WORKER_HOSTNAMES", ""):
    return "TPU pod"
  return None


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
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise UsageError(f"--process_id={process_id}: must be in [0, --num_processes="
                       f"{num_processes})")
    return f"process {process_id} of {num_processes} via {coordinator_address}"
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
  None."""
  how = plan(mode, coordinator_address, num_processes, process_id)
  if how is None:
    return None
  # CPU processes exchange collectives through gloo (no effect on accelerators).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             heartbeat_timeout_seconds=heartbeat_timeout_seconds)
  return how
