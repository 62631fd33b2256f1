"""User errors: wrong commands or configs, reported as one line and exit code 2.

Anything raised as `UsageError` is the user's to fix (an unknown name, a bad value, a failed
`Setup.validate()`), so the executor prints its message without a traceback. Every message
names the field, the value and the fix or the valid choices; `shown(value)` is how a message
echoes a value, so that no value can make it long, multi-line, or fail to print.
"""

import errno
import re

# What `--flag=` (`--flag=$UNSET`) is told, by every command: a flag given empty must not be
# mistaken for one left out, and a name or path given empty would be silently ignored.
EMPTY_VALUE = ("empty (an unset shell variable gives an empty value); give a value, or leave "
               "the flag out")

# Longest repr a message echoes; a longer value is described by its type and size instead.
SHOWN_LIMIT = 200


def one_line(message: str) -> str:
  """`message` as the one line of valid UTF-8 the contract promises, whatever it quotes: a
  value the user typed with a newline or another control character (`--exp=$'a\\nb'`) comes
  escaped as Python would write it, and a file name's undecodable bytes (which arrive as lone
  surrogates, that no file or terminal takes) as `\\xff`."""
  try:
    message = message.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
  except UnicodeEncodeError:  # A surrogate that no byte decodes to.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
  return "".join(ch if ch.isprintable() or ch == " " else
                 ch.encode("unicode_escape").decode("ascii") for ch in message)


class UsageError(Exception):
  """A command-line or config mistake, detected before any device time is spent."""


class DataError(Exception):
  """Bad data met while building a token store or reading one mid-run (a file that is not
  UTF-8, a malformed record, an unreadable shard): exit code 1, one line that names the file
  and the record. Nothing it interrupted is left looking complete."""


class OutputFailure(Exception):
  """Results cannot be written where they must go (stdout is closed, say): exit code 1, one
  line, as for a write that failed on the way; found before anything runs where it can be, so
  that nothing is computed only to be lost."""


# Put before a DataError's message raised inside tf.data, which re-raises it as a TensorFlow
# error whose message holds the original's text among node names and a traceback.
DATA_ERROR_MARKER = "lingvo_lite.DataError: "


def message_of(exception: BaseException) -> str:
  """`str(exception)`, or '' where its `__str__` raises: an exception of the user's code may
  be one whose message cannot be made, and telling it must not raise a second time."""
  try:
    return str(exception)
  except Exception:  # pylint: disable=broad-except
    return ""


def data_error_from(exception: BaseException) -> DataError | None:
  """The DataError that a data reader raised, from the exception that reached the caller.

  Args:
    exception: What iterating a dataset raised: the DataError itself, or the TensorFlow
      error (InvalidArgumentError, UnknownError) that tf.data wrapped it in.

  Returns:
    A DataError with the reader's one-line message, or None when `exception` (and its causes)
    came from no reader.
  """
  seen = exception
  while seen is not None:
    text = message_of(seen)
    start = text.find(DATA_ERROR_MARKER)
    if start >= 0:
      return DataError(text[start + len(DATA_ERROR_MARKER):].split("\n", 1)[0].strip())
    if isinstance(seen, DataError):
      return seen
    seen = seen.__cause__ or seen.__context__
  return None


# tf.data's re-raised errors start with the graph node that failed, before the original text.
_TF_NODE = re.compile(r"^\{\{function_node [^}]*\}\}\s*")
# `ValueError: boom`: the text of an exception raised inside tf.data (by a reader, a generator).
_RAISED_INSIDE = re.compile(r"^([A-Z]\w*(?:Error|Exception|Exit|Interrupt|Iteration)):\s*(.*)$")


def error_cause(exception: BaseException) -> str:
  """What went wrong, in one line, for an exception from reading a dataset (or any other).

  Returns:
    A data reader's DataError message (see `data_error_from`); else the error that TensorFlow
    wrapped (`ValueError: boom`, not `InvalidArgumentError: {{function_node ...}} ValueError:
    boom`); else `Type: first line of the message`; the type's name alone when the message is
    empty (`EOFError`), so that a cause is never blank.
  """
  found = data_error_from(exception)
  if found is not None and message_of(found).strip():
    return message_of(found).strip()
  exception = found or exception
  lines = message_of(exception).strip().splitlines()
  first = _TF_NODE.sub("", lines[0]).strip()[:300] if lines else ""
  inside = _RAISED_INSIDE.match(first)
  if inside and inside.group(1) != type(exception).__name__:
    return f"{inside.group(1)}: {inside.group(2)}" if inside.group(2) else inside.group(1)
  return f"{type(exception).__name__}: {first}" if first else type(exception).__name__


def _sized(value: object) -> str:
  """`<int of 66439 bits>`, `<str of 100002 characters>`, `<list of 3 items>`, `<Foo>`."""
  kind = type(value).__name__
  if isinstance(value, bool):
    return f"<{kind}>"
  if isinstance(value, int):
    return f"<{kind} of {value.bit_length()} bits>"
  if isinstance(value, (str, bytes)):
    return f"<{kind} of {len(value)} characters>"
  try:
    return f"<{kind} of {len(value)} items>"  # type: ignore[arg-type]
  except Exception:  # pylint: disable=broad-except
    return f"<{kind}>"


def shown(value: object, limit: int = SHOWN_LIMIT) -> str:
  """`repr(value)` on one line of at most `limit` characters, for an error message; never raises.

  A repr that would be longer or span lines, or that raises (Python refuses the repr of an
  int of more than 4300 digits, `sys.get_int_max_str_digits()`; a user class's `__repr__` may
  have a bug), gives the value's type and size instead.
  """
  try:
    text = repr(value)
  except Exception:  # pylint: disable=broad-except
    return _sized(value)
  if len(text) > limit or "\n" in text or "\r" in text:
    return _sized(value)
  return text


def config_error(path: str, value: object, problem: str, fix: str = "") -> UsageError:
  """Builds the house-style message: `<path>=<value>: <problem>[; <fix>]`."""
  message = f"{path}={shown(value)}: {problem}"
  if fix:
    message += f"; {fix}"
  return UsageError(message)


# What an OSError met writing an output means and the remedy of its own, by errno. A full disk
# and a read-only mount, a reader that closed its end of a pipe and a folder with the wrong
# permissions want different fixes; one table, so that every program names them alike.
_OS_ERROR_TEXTS = {
    "EPIPE": ("the reader closed the pipe", "keep the reader open until the output ends"),
    "ENOSPC": ("the disk is full", "free space"),
    "EDQUOT": ("the disk quota is used up", "free space or raise the quota"),
    "EFBIG": ("the file is larger than this file system allows", ""),
    "EROFS": ("the file system is read-only", "remount it read-write"),
    "EACCES": ("permission denied", "fix the folder's permissions"),
    "EPERM": ("the operation is not permitted", "fix the folder's permissions"),
    "ENOENT": ("the folder is gone", "create it again"),
    "ENOTDIR": ("a file stands where a folder should be", "move it away"),
    "EISDIR": ("a folder stands where the file should be", "move it away"),
    "EEXIST": ("something else was written there meanwhile", "move it away"),
    "ENAMETOOLONG": ("the name is longer than this file system allows", "use a shorter path"),
    "EIO": ("the device reported an I/O error", "check the disk"),
    "EBADF": ("the output is not open for writing", ""),
}


def os_error_text(error: OSError, alternative: str = "write elsewhere") -> tuple[str, str]:
  """(what went wrong, how to fix it) for an OSError met writing an output.

  `os_error_text(e, "use another --job_log_dir")` of a read-only mount gives `("the file
  system is read-only (EROFS)", "remount it read-write, or use another --job_log_dir")`. The
  errno's name stays in the problem, so a user can search for it; an errno the table does not
  know gives the system's own text and `alternative` alone.
  """
  name = errno.errorcode.get(error.errno or 0, "")
  if name in _OS_ERROR_TEXTS:
    problem, remedy = _OS_ERROR_TEXTS[name]
    return f"{problem} ({name})", f"{remedy}, or {alternative}" if remedy else alternative
  detail = " ".join((error.strerror or str(error) or type(error).__name__).split())
  return (f"{detail} ({name})" if name else f"{type(error).__name__}: {detail}"), alternative
