"""What the libraries under a run log, kept to what is worth reading: orbax and JAX log every
checkpoint step at INFO, and orbax logs hundreds of lines of tracebacks from its background
threads about a failure lingvo_lite reports in one line of its own (a failed save, an
incomplete step). `--verbosity` (`-v 0`) shows them all again: the executor quiets them only
where it was not given."""

from __future__ import annotations

import logging as std_logging
import os
import traceback
import warnings

from absl import logging


def quiet() -> None:
  """Logs at WARNING and above, without orbax's own warnings and errors (`quiet_orbax`)."""
  logging.set_verbosity(logging.WARNING)
  logging.get_absl_handler().addFilter(quiet_orbax)
  # On asyncio's own logger too: a task collected at interpreter exit, after absl's handler
  # is gone, reaches logging's last-resort handler, which no handler filter sees.
  std_logging.getLogger("asyncio").addFilter(quiet_orbax)
  # A save that failed (a full disk) leaves the writes orbax had queued unstarted; Python
  # warns of each at interpreter exit, after the one error line that already says what
  # happened.
  warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited",
                          category=RuntimeWarning)


def quiet_orbax(record: std_logging.LogRecord) -> bool:
  """Drops orbax's own warnings and errors (False), lets the rest through (True). asyncio's
  "Task exception was never retrieved" about one of orbax's write tasks is the same failure
  again, logged whenever the garbage collector meets the task (so only in some runs)."""
  orbax = f"{os.sep}orbax{os.sep}"
  if orbax in record.pathname:
    return False
  if record.name != "asyncio":
    return True
  # A task's coroutine is named in the message, a gathering future's only in the traceback,
  # and a plain future that tensorstore failed only in its exception's text, which quotes the
  # checkpoint's temporary folder ("3.orbax-checkpoint-tmp"): any mention of orbax will do.
  error = record.exc_info[1] if record.exc_info else None
  trace = record.exc_info[2] if record.exc_info else None
  frames = traceback.extract_tb(trace) if trace is not None else []
  return not ("orbax" in record.getMessage() or "orbax" in str(error)
              or any(orbax in f.filename for f in frames))
