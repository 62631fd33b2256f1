"""Calling one reward function under the failure policy: a value, or 0 and why.

A reward that fails scores 0 and is counted, never raised and never NaN: one that raises
(anything but Ctrl-C, which still stops the run), returns something other than a real number
(Python's, NumPy's, a one-element array), returns a non-finite value, or runs past its time
limit. `call` gives (value, None) or (0, why); `combined` makes one completion's weighted total
of them, each failure a line naming the function, the prompt's id and why, and a sum that
overflows one more. Why 0 and go on rather than stop the run: one bad completion (a regex that
meets text nobody foresaw, a test that hangs) would otherwise end hours of training, and a
reward that fails for every completion shows as its per-function mean pinned at 0 and a
failure count equal to the completions, in the first step's log line.

The time limit is kept two ways. Called from the main thread, a SIGALRM sent to that thread
interrupts the function's Python code at the limit, and again every `_REPEAT_S` after, in case
it swallowed the first interruption (`_limited`). Whatever the thread, a call that took longer
than its limit scores 0 whatever it returned. Neither stops code that never returns to Python
(a C loop); code that may run away (a completion's program) belongs in a subprocess with
limits of its own, as `code_tests` runs it (`sandbox.py`).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from typing import Any, Callable, Sequence

from lingvo_lite.errors import message_of, one_line, shown
from lingvo_lite.runtime import user_code

# After the first interruption, again this often, for a function that caught the first.
_REPEAT_S = 0.25
# Longest failure reason kept (a raised message can be any length).
_REASON_CHARS = 300


def prompt_id(record: object) -> str:
  """A record's id as a failure line shows it."""
  return shown(record.get("id", "?") if isinstance(record, dict) else "?", 80)


class _PastLimit(BaseException):
  """Raised into a reward at its limit; a BaseException, so `except Exception` in it won't
  swallow it."""


def call(fn: Callable[[dict, str], Any], limit_s: float, record: dict, completion: str
         ) -> tuple[float, str | None]:
  """`fn(record, completion)` as (value, None), or (0, why it failed)."""
  start = time.monotonic()
  try:
    value = _limited(fn, record, completion, limit_s)
  except _PastLimit:
    return 0.0, f"ran past its {limit_s:g} s limit"
  except KeyboardInterrupt:
    raise
  except BaseException as e:  # pylint: disable=broad-except
    # Anything of the function's: SystemExit and GeneratorExit too, never the run's end.
    return 0.0, f"raised {user_code.describe(e)[:_REASON_CHARS]}"
  elapsed = time.monotonic() - start
  if elapsed > limit_s:
    return 0.0, f"ran {elapsed:.3g} s, past its {limit_s:g} s limit"
  # A real number: Python's, NumPy's, or a one-element array of them (a jnp scalar); not
  # text, which float() would parse, nor complex.
  if isinstance(value, (str, bytes, complex)) or not hasattr(type(value), "__float__"):
    return 0.0, f"returned {shown(value, 80)}, not a number"
  try:
    value = float(value)
  except Exception as e:  # pylint: disable=broad-except
    return 0.0, f"returned {shown(value, 80)}, not a real number ({message_of(e)[:80]})"
  if not math.isfinite(value):
    return 0.0, f"returned {value}, not a finite number"
  return value, None


def _limited(fn: Callable[[dict, str], Any], record: dict, completion: str,
             limit_s: float) -> object:
  """`fn(record, completion)`, interrupted at `limit_s` on the main thread (module doc).

  The interruption is a SIGALRM sent to the main thread alone (`pthread_kill` from a watcher
  thread), not a process timer: a process-directed signal may land on any thread, and a
  library's thread (XLA's, say) blocked in a system call would see EINTR. An alarm that is not
  ours, met during the call, goes to the caller's handler.
  """
  if threading.current_thread() is not threading.main_thread():
    return fn(record, completion)
  main, done = threading.get_ident(), threading.Event()
  armed, fired = [True], [False]
  previous = signal.getsignal(signal.SIGALRM)

  def on_alarm(signum, frame):
    if fired[0]:
      if armed[0]:  # One that lands after the call returned is dropped.
        raise _PastLimit()
    elif callable(previous):
      previous(signum, frame)

  def watch():
    waited = limit_s
    while not done.wait(waited):
      fired[0] = True
      signal.pthread_kill(main, signal.SIGALRM)
      waited = _REPEAT_S

  signal.signal(signal.SIGALRM, on_alarm)
  watcher = threading.Thread(target=watch, name="reward-limit", daemon=True)
  try:
    watcher.start()
    return fn(record, completion)
  finally:
    armed[0] = False  # First, with no call before it: no handler can raise past this point.
    done.set()
    watcher.join()
    # None: a handler installed outside Python, which Python cannot put back; the default.
    signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


def combined(specs: Sequence[tuple[str, float]], record: dict,
             results: list[tuple[float, str | None]]
             ) -> tuple[float, dict[str, float], list[str]]:
  """One completion's `ScoredCompletion`-to-be: (total, per function, failure lines), from each
  reward's (value, why it failed) as `call` gives them, in the order of `specs`."""
  per_function: dict[str, float] = {}
  failures: list[str] = []
  total = 0.0
  for (name, weight), (value, why) in zip(specs, results):
    if why is not None:
      failures.append(one_line(f"reward {name} on prompt {prompt_id(record)}: {why}; "
                               "scored 0"))
      value = 0.0
    per_function[name] = value
    total += float(weight) * value
  if not math.isfinite(total):  # Finite values and weights whose products overflow.
    failures.append(one_line(f"rewards on prompt {prompt_id(record)}: the weighted sum of "
                             f"{shown(per_function, 120)} overflows; scored 0"))
    total = 0.0
  return total, per_function, failures
