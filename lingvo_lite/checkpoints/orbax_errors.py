"""What goes wrong writing and reading checkpoints, in one line each.

orbax and tensorstore report a failed save or a damaged step as long chains of wrapped
exceptions (tensorstore's messages name every path and spec) and, after a failed save, as
tracebacks from background threads and callbacks into a closed event loop. This module turns
the chain into one line led by the operating system's words (`innermost_cause`), finds its errno
(`errno_of`: the fix a message names depends on it), and keeps orbax's after-the-fact noise
off stderr (`silence_closed_loop_errors`).
"""

from __future__ import annotations

import errno
import os
import re
import sys
import traceback


class CheckpointWriteError(RuntimeError):
  """A save failed; the message is one line naming the step and the cause.

  Attributes:
    errno: The operating system's error number of the cause, where one is known (ENOSPC:
      a full disk), for the fix a message names.
  """

  def __init__(self, message: str, cause: BaseException | None = None):
    super().__init__(message)
    self.errno = errno_of(cause) if cause is not None else None


def silence_closed_loop_errors() -> None:
  """After a failed save, each of tensorstore's callbacks into orbax's already closed asyncio
  loop reports 'Event loop is closed' as an unraisable exception, a traceback apiece: tens of
  lines of noise around the one line that says what failed. So does any other unraisable
  exception raised in orbax's code; every other one still reaches the original hook."""
  original = sys.unraisablehook
  if getattr(original, "lingvo_lite_filter", False):
    return

  def hook(unraisable):
    value = unraisable.exc_value
    if isinstance(value, RuntimeError) and str(value) == "Event loop is closed":
      return
    # Anything else raised inside orbax's background work after a failed save (a coroutine
    # or future collected unfinished) is that failure again, already the run's one line.
    # A failure tensorstore set from C++ has no Python frames; its text quotes the
    # checkpoint's temporary folder ("3.orbax-checkpoint-tmp").
    frames = traceback.extract_tb(unraisable.exc_traceback) if unraisable.exc_traceback else []
    if not ("orbax" in str(value)
            or any(f"{os.sep}orbax{os.sep}" in frame.filename for frame in frames)):
      original(unraisable)
  hook.lingvo_lite_filter = True
  sys.unraisablehook = hook


# The operating system's failures a save meets, by the words tensorstore quotes them in.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EIO)


def _chain(error: BaseException) -> list[BaseException]:
  """`error` and its causes (or the exceptions it was raised while handling), outermost first."""
  chain = [error]
  while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
    chain.append(chain[-1].__cause__ or chain[-1].__context__)
  return chain


def innermost_cause(error: BaseException) -> str:
  """The innermost cause of an exception chain, in one line, led by the operating system's
  word for what went wrong where any exception of the chain quotes one."""
  chain = _chain(error)
  error = chain[-1]
  text = " ".join(str(error).split())
  everything = " ".join(" ".join(str(e).split()) for e in chain)
  # tensorstore's messages name every path and spec; the operating system's word for what
  # went wrong ("No space left on device") sits before its `[os_error_code=N]`, in most of
  # them: a metadata write's message quotes the words alone.
  cause = None
  os_error = re.search(r":\s*([^:\[\]\"]+?)\s*\[os_error_code='?(\d+)", everything)
  if os_error:
    cause = f"{os_error.group(1)} (errno {os_error.group(2)})"
  else:
    cause = next((f"{os.strerror(n)} (errno {n})" for n in _WRITE_ERRNOS
                  if os.strerror(n) in everything), None)
  if len(text) > 300:
    text = f"{text[:240]} ..."
  if cause:
    text = f"{cause}; {text}"
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def errno_of(error: BaseException) -> int | None:
  """The operating system's error number behind an exception chain: an OSError's, or the one
  tensorstore quotes (`[os_error_code=28]`) or names in words."""
  chain = _chain(error)
  for e in chain:
    if isinstance(e, OSError) and e.errno:
      return e.errno
  everything = " ".join(str(e) for e in chain)
  quoted = re.search(r"os_error_code='?(\d+)", everything)
  if quoted:
    return int(quoted.group(1))
  return next((n for n in _WRITE_ERRNOS if os.strerror(n) in everything), None)


# What orbax and tensorstore raise reading a damaged step, alone or as some wrapper's cause.
READ_ERRORS = (OSError, ValueError, KeyError, TypeError, RuntimeError)


def caused_by(error: BaseException, types: tuple[type[BaseException], ...]) -> bool:
  while error is not None:
    if isinstance(error, types):
      return True
    error = error.__cause__ or error.__context__
  return False
