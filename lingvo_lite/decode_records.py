"""The records of decode answers: one JSON line per completion, and their writer.

Each answer is one JSON line (strict JSON: no NaN or Infinity), `record()`'s schema 1:

  schema_version   1; a reader refuses versions it does not know.
  index            int: the request's position among all requests (--prompt ones first), from 0.
  source           str: where the request came from: "--prompt #1" or "p.jsonl:3" (file:line).
  prompt           str or null: the prompt as text (null without a text vocabulary).
  prompt_ids       [int]: the token ids the model was given as the prompt.
  completion       str or null: the generated text, cut just before the stop string that
                   ended it (null without a text vocabulary).
  completion_ids   [int]: every generated token, up to and including the EOS token or the
                   token that completed a stop string.
  logprobs         [float or null]: one per completion_ids entry: the model's own
                   log-probability of that token (log-softmax of the logits before
                   temperature, top-k and top-p); null where it is not finite.
  stop_reason      "eos" | "stop" (a stop string) | "max_new_tokens".
  stop_string      str or null: the stop string that matched, for "stop".
  settings         {max_new_tokens, temperature, top_k, top_p, seed, stop}: the values used,
                   after the config's defaults were applied.
  checkpoint_step  int: the step of the checkpoint whose parameters decoded it.
  timing           {prefill_seconds: from the start of its prefill call to its first token,
                    decode_seconds: from its first token to its last,
                    tokens_per_second: (len(completion_ids) - 1) / decode_seconds, the decode
                    rate after the first token; null where decode_seconds is 0}.

`CompletionWriter` writes them to a file (by default JOB/decode/<UTC time>.jsonl) or to stdout.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import sys
import time
from typing import Any, Callable, Mapping

from etils import epath

from lingvo_lite import paths
from lingvo_lite.decode_requests import Request, one_line
from lingvo_lite.errors import UsageError, shown

SCHEMA_VERSION = 1
STOP_REASONS = ("eos", "stop", "max_new_tokens")


# ----------------------------------------------------------------------------- answers


@dataclasses.dataclass(frozen=True)
class Completion:
  """One request's answer, as the generator produced it (see the module doc's schema)."""

  request: Request
  prompt_ids: tuple[int, ...]
  prompt_text: str | None
  completion_ids: tuple[int, ...]
  completion_text: str | None
  logprobs: tuple[float, ...]
  stop_reason: str
  stop_string: str | None
  settings: dict
  checkpoint_step: int
  prefill_seconds: float
  decode_seconds: float


def tokens_per_second(completion: Completion) -> float | None:
  """The decode rate after the first token (which the prefill made); None if undefined."""
  seconds = completion.decode_seconds
  if len(completion.completion_ids) < 2 or not (math.isfinite(seconds) and seconds > 0):
    return None
  return (len(completion.completion_ids) - 1) / seconds


def record(completion: Completion, index: int) -> dict[str, Any]:
  """The JSON object of `completion`, schema 1 (see the module doc); strict JSON throughout.

  Raises:
    ValueError: an unknown stop_reason, or logprobs not one per completion token: the
      generator's bug, not the user's.
  """
  if completion.stop_reason not in STOP_REASONS:
    raise ValueError(f"stop_reason={completion.stop_reason!r}: not one of {STOP_REASONS}")
  if len(completion.logprobs) != len(completion.completion_ids):
    raise ValueError(f"{len(completion.logprobs)} logprobs for "
                     f"{len(completion.completion_ids)} completion tokens")
  return {
      "schema_version": SCHEMA_VERSION,
      "index": int(index),
      "source": completion.request.source,
      "prompt": completion.prompt_text,
      # int(): the generator's ids may be numpy ints, which json cannot write.
      "prompt_ids": [int(token) for token in completion.prompt_ids],
      "completion": completion.completion_text,
      "completion_ids": [int(token) for token in completion.completion_ids],
      "logprobs": [_finite(value) for value in completion.logprobs],
      "stop_reason": completion.stop_reason,
      "stop_string": completion.stop_string,
      "settings": _json_safe(dict(completion.settings)),
      "checkpoint_step": (None if completion.checkpoint_step is None
                          else int(completion.checkpoint_step)),
      "timing": {
          "prefill_seconds": _finite(completion.prefill_seconds),
          "decode_seconds": _finite(completion.decode_seconds),
          "tokens_per_second": _finite(tokens_per_second(completion)),
      },
  }


def _finite(value: Any) -> float | None:
  if value is None:
    return None
  value = float(value)
  return value if math.isfinite(value) else None


def _json_safe(value: Any) -> Any:
  """Settings as JSON writes them strictly: tuples as lists, numpy scalars as Python's."""
  if isinstance(value, Mapping):
    return {str(key): _json_safe(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_safe(item) for item in value]
  if isinstance(value, bool) or value is None or isinstance(value, str):
    return value
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    return _finite(value)
  return str(value)


def format_human(completion: Completion) -> str:
  """A few lines for a person at a terminal: source, why it stopped, rate; prompt, completion.

  Text is shown as it is (newlines indented under its label), but with other control
  characters escaped, so that no completion can move the cursor or recolor the terminal.
  """
  reason = completion.stop_reason
  if reason == "stop":
    reason = f"stop string {shown(completion.stop_string)}"
  rate = tokens_per_second(completion)
  count = len(completion.completion_ids)
  header = (f"{completion.request.source}: {count} token{'s' if count != 1 else ''}, "
            f"stopped at {reason}" + (f", {rate:.1f} tokens/s" if rate is not None else ""))

  def shown_text(text: str | None, ids: tuple[int, ...]) -> str:
    if text is None:
      return str([int(token) for token in ids])
    printable = "".join(ch if ch.isprintable() or ch in "\n\t" else ch.encode(
        "unicode_escape").decode("ascii") for ch in text)
    return printable.replace("\n", "\n              ")

  return (f"{header}\n  prompt:     {shown_text(completion.prompt_text, completion.prompt_ids)}"
          f"\n  completion: "
          f"{shown_text(completion.completion_text, completion.completion_ids)}")


# ----------------------------------------------------------------------------- writing answers


class CompletionWriter:
  """Writes each completion's record as a JSON line, as it comes; a context manager.

  `destination`:
    "-"         JSON lines on stdout (always JSON, terminal or not: stdout is then the
                machine-readable output, and the program's own messages must go to stderr).
    "" or None  JOB/decode/<UTC time>.jsonl, e.g. JOB/decode/20261201T201913Z.jsonl, with a
                -2, -3, ... suffix where that name is taken.
    a path      that file (relative to the working directory); its folder must exist, and
                the file must not: nothing is ever overwritten.

  A file is written as `<name>.partial`, a line per completion, flushed, so a user can watch
  it; it gets its name on a clean exit of the `with` block. A killed or failed run so leaves
  a `.partial` file (or none, if it had written nothing) that no reader takes for a whole
  answer set, as a file written in place would look after a kill between two lines. The
  `.partial` name is created exclusively, so two runs can never write one file. When stdout
  is a terminal, each completion written to a file is also printed in `format_human`'s form.
  """

  def __init__(self, destination: str | None, job_dir: epath.Path | None,
               shown_job_dir: str | None, now: Callable[[], float] = time.time):
    self._count = 0
    self._file = None
    self._partial: epath.Path | None = None
    self._path: epath.Path | None = None
    if destination == "-":
      self._echo = False
      return
    if destination:
      flag = f"--decode_out={one_line(destination)}"
      path = paths.resolve(destination, "--decode_out")
      if destination.endswith("/") or path.is_dir():
        raise UsageError(f"{flag}: is a directory; give a file name, e.g. "
                         f"{one_line(destination.rstrip('/'))}/answers.jsonl")
      if not path.parent.is_dir():
        raise UsageError(f"{flag}: its folder {one_line(str(path.parent))} does not exist; "
                         "create it, or give a path in an existing folder")
      if path.exists():
        raise UsageError(f"{flag}: already exists, and is never overwritten; give a new "
                         "path, or move the file away")
      self._open(flag, path, exclusive_fix="another decode is writing it, or a killed one "
                 "left it; move it away, or give another path")
    else:
      if job_dir is None:
        raise UsageError("--decode_out=: no job dir to write completions into; pass "
                         "--job_log_dir=JOB, or --decode_out=FILE (or - for stdout)")
      folder = job_dir / "decode"
      shown_folder = f"{one_line(shown_job_dir or str(job_dir))}/decode"
      try:
        folder.mkdir(parents=True, exist_ok=True)
      except OSError as e:
        raise UsageError(f"--job_log_dir={one_line(shown_job_dir or str(job_dir))}: cannot "
                         f"create {shown_folder} ({e.strerror or type(e).__name__}); make "
                         "the job dir writable, or pass --decode_out=FILE") from None
      stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now()))
      for suffix in range(1, 10_000):
        path = folder / (f"{stamp}.jsonl" if suffix == 1 else f"{stamp}-{suffix}.jsonl")
        if not path.exists() and self._open(f"--job_log_dir={shown_folder}", path):
          break
      else:
        raise UsageError(f"--job_log_dir={shown_folder}: every name for {stamp} is taken; "
                         "pass --decode_out=FILE")
    self._echo = _is_terminal(sys.stdout)

  def _open(self, flag: str, path: epath.Path, exclusive_fix: str | None = None) -> bool:
    """Creates `path`.partial to write; False if it exists and `exclusive_fix` is None."""
    partial = path.parent / f"{path.name}.partial"
    try:
      if paths.is_remote(str(partial)):
        if partial.exists():
          raise FileExistsError(partial)
        self._file = partial.open("w")  # No exclusive create there; a check is what remains.
      else:
        self._file = open(os.fspath(partial), "x", encoding="utf-8")
    except FileExistsError:
      if exclusive_fix is None:
        return False
      raise UsageError(f"{flag}: {one_line(partial.name)} exists: {exclusive_fix}") from None
    except OSError as e:
      raise UsageError(f"{flag}: cannot be written ({e.strerror or type(e).__name__}); give "
                       "a path in a writable folder") from None
    self._partial, self._path = partial, path
    return True

  @property
  def path(self) -> epath.Path | None:
    """The file's final name (it is `<name>.partial` until the close); None for stdout."""
    return self._path

  @property
  def count(self) -> int:
    """How many completions were written."""
    return self._count

  def write(self, completion: Completion, index: int) -> None:
    """Writes `completion`'s record as one line, flushed; at a terminal, a human form too."""
    row = record(completion, index)
    if self._file is None:
      # ASCII escapes on stdout: its encoding may not be UTF-8 (LANG=C), and JSON needs none.
      print(json.dumps(row, allow_nan=False), flush=True)
    else:
      # UTF-8 in the file; a lone surrogate (no decoder should make one) becomes its JSON
      # escape (\udcff) rather than an error after the decode is done.
      line = json.dumps(row, allow_nan=False, ensure_ascii=False)
      self._file.write(line.encode("utf-8", "backslashreplace").decode("utf-8") + "\n")
      self._file.flush()
      if self._echo:
        text = format_human(completion)
        encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
        print(text.encode(encoding, "backslashreplace").decode(encoding), flush=True)
    self._count += 1

  def close(self, succeeded: bool = True) -> None:
    """Gives the file its name if `succeeded`; else leaves the `.partial` (if it has lines)."""
    if self._file is None:
      return
    self._file.close()
    self._file = None
    if not succeeded:
      if self._count == 0:
        self._partial.unlink()  # Nothing in it to keep.
      return
    self._partial.rename(self._path)

  def __enter__(self) -> CompletionWriter:
    return self

  def __exit__(self, kind, value, traceback) -> None:
    self.close(succeeded=kind is None)


def _is_terminal(stream: Any) -> bool:
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):  # A replaced or closed stdout.
    return False
