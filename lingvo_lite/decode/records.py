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

Longer than 300 lines with a reason: the schema above and the writer of its lines live together so
that the format has one home; most of the length is `CompletionWriter`'s careful writing
(destination checks, `.partial` files, stdout).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import numbers
import os
import sys
import time
from typing import Any, Callable, Iterator, Mapping

from etils import epath

from lingvo_lite import outputs, paths
from lingvo_lite.decode.requests import Request, one_line
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


# Names of this process's stdout that users write out of habit (`--decode_out=/dev/stdout`):
# the stream, not a file that exists and must not be overwritten.
STDOUT_NAMES = ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")


def is_stdout(destination: str | None) -> bool:
  """Whether `--decode_out=destination` means stdout."""
  return destination in STDOUT_NAMES


class CompletionWriter:
  """Writes each completion's record as a JSON line, as it comes; a context manager.

  `destination`:
    "-"         JSON lines on stdout (always JSON, terminal or not: stdout is then the
                machine-readable output, and the program's own messages must go to stderr);
                /dev/stdout and its other names (STDOUT_NAMES) mean the same; refused when
                stdout is closed.
    "" or None  JOB/decode/<UTC time>.jsonl, e.g. JOB/decode/20261201T201913Z.jsonl, with a
                -2, -3, ... suffix where that name is taken.
    a path      that file (relative to the working directory); its folder must exist, and
                the file must not: nothing is ever overwritten (lingvo_lite/outputs.py), nor
                written inside the job's checkpoints/.

  Whether the destination can be written is checked when the writer is made, before the
  checkpoint is read; the file (and JOB/decode/) is created only with the first completion,
  so a run that fails before it leaves the job dir as it was. A file is written as
  `<name>.partial`, a line per completion, flushed, so a user can watch it; it gets its name
  on a clean exit of the `with` block, never over a file that appeared there meanwhile. A
  killed or failed run so leaves a `.partial` file (or nothing, if it had written nothing)
  that no reader takes for a whole answer set, as a file written in place would look after a
  kill between two lines. The `.partial` name is created exclusively, so two runs can never
  write one file. When stdout is a terminal, each completion written to a file is also
  printed in `format_human`'s form.
  """

  def __init__(self, destination: str | None, job_dir: epath.Path | None,
               shown_job_dir: str | None, now: Callable[[], float] = time.time):
    self._count = 0
    self._file = None
    self._partial: epath.Path | None = None
    self._path: epath.Path | None = None
    self._to_stdout = is_stdout(destination)
    self._folder: epath.Path | None = None  # JOB/decode/, when the name is chosen there.
    self._stamp = ""
    self._flag = ""
    self._created: list[str] = []  # Folders the first write created (removed if it fails).
    if self._to_stdout:
      outputs.check_stdout("--decode_out=-", "run it with stdout open (a file, a pipe or a "
                           "terminal), or give --decode_out=FILE")
      self._echo = False
      return
    if destination:
      self._flag = f"--decode_out={one_line(destination)}"
      path = paths.resolve(destination, "--decode_out")
      self._check_file(path, destination, job_dir)
      self._path = path
    else:
      if job_dir is None:
        raise UsageError("--decode_out=: no job dir to write completions into; pass "
                         "--job_log_dir=JOB, or --decode_out=FILE (or - for stdout)")
      shown = one_line(shown_job_dir or str(job_dir))
      self._flag = f"--job_log_dir={shown}/decode"
      self._folder = job_dir / "decode"
      self._check_folder(self._folder, shown)
      self._stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now()))
      self._path = next(self._free_names(), None)
      if self._path is None:
        raise UsageError(f"{self._flag}: every name for {self._stamp} is taken; pass "
                         "--decode_out=FILE")
    self._echo = _is_terminal(sys.stdout)

  def _check_file(self, path: epath.Path, destination: str, job_dir: epath.Path | None) -> None:
    flag = self._flag
    if destination.endswith("/") or path.is_dir():
      raise UsageError(f"{flag}: is a directory; give a file name, e.g. "
                       f"{one_line(destination.rstrip('/'))}/answers.jsonl")
    outputs.refuse_inside_checkpoints(path, flag, job_dir)
    if not path.parent.is_dir():
      raise UsageError(f"{flag}: its folder {one_line(str(path.parent))} does not exist; "
                       "create it, or give a path in an existing folder")
    if path.exists() or os.path.lexists(os.fspath(path)):
      raise UsageError(f"{flag}: already exists, and is never overwritten; give a new "
                       "path, or move the file away")
    if (path.parent / f"{path.name}.partial").exists():
      raise UsageError(f"{flag}: {one_line(path.name)}.partial exists: another decode is "
                       "writing it, or a killed one left it; move it away, or give another path")
    if not paths.is_remote(str(path)):
      problem = paths.creation_problem(path.parent)
      if problem is not None:
        raise outputs.refusal(flag, problem, f"create files in {one_line(str(path.parent))}",
                              "give a path in a writable folder")

  @staticmethod
  def _check_folder(folder: epath.Path, shown_job_dir: str) -> None:
    """JOB/decode/ can take the file: it exists and takes files, or it can be created."""
    flag = f"--job_log_dir={shown_job_dir}"
    if paths.is_remote(str(folder)):
      return
    fix = "pass --decode_out=FILE (or - for stdout)"
    if os.path.isdir(os.fspath(folder)):
      problem = paths.creation_problem(folder)
      if problem is not None:
        raise outputs.refusal(flag, problem, f"create files in {shown_job_dir}/decode", fix)
    else:
      outputs.check_creatable(folder, flag, fix)

  def _open(self) -> None:
    """Creates the `.partial` file (and JOB/decode/ where missing) to write: a name of its own
    in JOB/decode/, the --decode_out file's otherwise.

    Raises:
      OSError: it cannot be created (FileExistsError: the name was taken meanwhile).
    """
    if self._folder is None:
      self._file = self._create(self._path)
      self._partial = self._path.parent / f"{self._path.name}.partial"
      return
    if paths.is_remote(str(self._folder)):
      self._folder.mkdir(parents=True, exist_ok=True)
    elif not os.path.lexists(os.fspath(self._folder)):
      os.mkdir(os.fspath(self._folder))
      self._created.append(os.fspath(self._folder))
    for path in self._free_names():
      try:
        self._file = self._create(path)
      except FileExistsError:
        continue  # Another decode of the same second took it meanwhile: the next suffix.
      self._partial, self._path = path.parent / f"{path.name}.partial", path
      return
    raise FileExistsError(errno.EEXIST, f"every name for {self._stamp} is taken",
                          os.fspath(self._folder))

  def _free_names(self) -> Iterator[epath.Path]:
    """JOB/decode/<stamp>.jsonl, then -2, -3, ...: those neither written nor being written."""
    for suffix in range(1, 10_000):
      path = self._folder / (f"{self._stamp}.jsonl" if suffix == 1 else
                             f"{self._stamp}-{suffix}.jsonl")
      if not (path.exists() or (path.parent / f"{path.name}.partial").exists()):
        yield path

  @staticmethod
  def _create(path: epath.Path) -> Any:
    """Opens `path`.partial for writing, created exclusively where the file system can."""
    partial = path.parent / f"{path.name}.partial"
    if paths.is_remote(str(partial)):
      if path.exists() or partial.exists():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(partial))
      return partial.open("w")  # No exclusive create there; a check is what remains.
    return open(os.fspath(partial), "x", encoding="utf-8")

  @property
  def path(self) -> epath.Path | None:
    """The file's final name (it is `<name>.partial` until the close); None for stdout."""
    return None if self._to_stdout else self._path

  @property
  def count(self) -> int:
    """How many completions were written."""
    return self._count

  def write(self, completion: Completion, index: int) -> None:
    """Writes `completion`'s record as one line, flushed; at a terminal, a human form too.

    Raises:
      OSError: the line cannot be written (a full disk, a closed pipe, ...).
    """
    row = record(completion, index)
    if self._to_stdout:
      # ASCII escapes on stdout: its encoding may not be UTF-8 (LANG=C), and JSON needs none.
      print(json.dumps(row, allow_nan=False), flush=True)
    else:
      if self._file is None:
        self._open()
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
    """Gives the file its name if `succeeded`; else leaves the `.partial` if it has lines, and
    removes what the writer created if it has none.

    Raises:
      OSError: the file cannot be finished or named (FileExistsError: a file appeared at its
        name meanwhile; it is left as the `.partial`).
    """
    file, self._file = self._file, None
    if succeeded:
      if file is not None:
        file.close()
        outputs.publish(self._partial, self._path)
      return
    if file is not None:
      with contextlib.suppress(OSError):  # The failure being reported is the one that counts.
        file.close()
    if self._count == 0:
      if self._partial is not None and os.path.lexists(os.fspath(self._partial)):
        self._partial.unlink()  # Nothing in it to keep.
      outputs.remove_empty_folders(self._created)
      self._created = []

  def __enter__(self) -> CompletionWriter:
    return self

  def __exit__(self, kind, value, traceback) -> None:
    self.close(succeeded=kind is None)


def _is_terminal(stream: Any) -> bool:
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):  # A replaced or closed stdout.
    return False
