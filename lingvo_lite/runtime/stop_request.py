"""Stopping a training run on SIGTERM, SIGINT or SIGHUP: between steps, with a checkpoint.

The first signal asks the loop to stop after the current step and save; a second SIGTERM or
SIGINT stops at once (exit code 130), as a second Ctrl-C does in most tools. SIGHUP, a hang-up
(the terminal was closed, the ssh session dropped), is a stop like SIGTERM; it often comes
twice (from the shell and from the terminal), and the system may end the session with a
SIGTERM after it, so neither stops a run at once after a hang-up; a SIGHUP ignored when the
run starts (`nohup`) stays ignored. After a hang-up the terminal is gone:
runtime/hangup.py keeps the run's writes to it from failing the save. With several processes,
every process must stop after the same step, since the checkpoint save is collective.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

import jax
from absl import logging
from jax._src import distributed as jax_distributed  # The preemption service's state.
from jax.experimental import multihost_utils

from lingvo_lite.runtime import hangup


class StopRequest:
  """SIGTERM, SIGINT or SIGHUP stops the run between steps, at the same step in every process.

  One process: the signal sets a flag the loop reads. Several processes: each may be
  signalled at a different step (or only one may be), so JAX's preemption service, which
  catches SIGTERM itself and shares the notice through the coordination service, picks the
  step they all stop after; SIGINT and SIGHUP are passed on to it as a SIGTERM.
  """

  def __init__(self):
    self.signal_name: str | None = None
    self._asked_by: str | None = None  # The first signal this process received.
    self._previous = {}
    self._shared = jax.process_count() > 1 and getattr(
        jax_distributed.global_state, "preemption_sync_manager", None) is not None
    if jax.process_count() > 1 and not self._shared:
      logging.warning("JAX's preemption service is off (jax_enable_preemption_service): a "
                      "SIGTERM must reach every process before the same step")

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      signums = [signal.SIGINT, signal.SIGHUP] if self._shared else [
          signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
      if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signums.remove(signal.SIGHUP)  # `nohup`: hang-ups are not to stop this run.
      for signum in signums:
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if signum == signal.SIGHUP:
      hangup.note_hangup()
    if self._asked_by is not None:
      if signum == signal.SIGHUP or (self._asked_by == "SIGHUP" and signum == signal.SIGTERM):
        # The same hang-up again (the shell passes on the terminal's), or the system ending
        # the session after it (systemd-logind sends SIGTERM): not a user in a hurry.
        return
      # A second Ctrl-C (or SIGTERM) means now: the pending save is abandoned, and the next
      # run removes what it left and resumes from the last verified step.
      with contextlib.suppress(OSError):  # A terminal that hung up answers EIO.
        print(f"lingvo_lite: {name} again: stopping at once, without saving", file=sys.stderr,
              flush=True)
      os._exit(130)  # pylint: disable=protected-access
    self._asked_by = name
    if self._shared:
      os.kill(os.getpid(), signal.SIGTERM)
    else:
      self.signal_name = name

  def should_stop(self, step: int) -> bool:
    """Called by every process with the starting step, then after every step.

    JAX's preemption service counts steps from 0 and stops at one past the highest step it
    has been told of: without the starting step, a stop asked for before a resumed run
    finished its first step would name step 1, which never comes. (A SIGTERM in the seconds
    between jax.distributed.initialize and the first call is still lost that way.)
    """
    if self._shared and multihost_utils.reached_preemption_sync_point(step):
      self.signal_name = self._asked_by or "SIGTERM"  # Another process's, passed on.
    return self.signal_name is not None

  def __exit__(self, *exc):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
