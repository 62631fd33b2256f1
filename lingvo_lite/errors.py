"""User errors: wrong commands or configs, reported as one line and exit code 2.

Anything raised as `UsageError` is the user's to fix (an unknown name, a bad value, a failed
`Setup.validate()`), so the executor prints its message without a traceback. Every message
names the field, the value and the fix or the valid choices; `shown(value)` is how a message
echoes a value, so that no value can make it long, multi-line, or fail to print.
"""

# Longest repr a message echoes; a longer value is described by its type and size instead.
SHOWN_LIMIT = 200


class UsageError(Exception):
  """A command-line or config mistake, detected before any device time is spent."""


class DataError(Exception):
  """Bad data met while building a token store or reading one mid-run (a file that is not
  UTF-8, a malformed record, an unreadable shard): exit code 1, one line that names the file
  and the record. Nothing it interrupted is left looking complete."""


# Put before a DataError's message raised inside tf.data, which re-raises it as a TensorFlow
# error whose message holds the original's text among node names and a traceback.
DATA_ERROR_MARKER = "lingvo_lite.DataError: "


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
    text = str(seen)
    start = text.find(DATA_ERROR_MARKER)
    if start >= 0:
      return DataError(text[start + len(DATA_ERROR_MARKER):].split("\n", 1)[0].strip())
    if isinstance(seen, DataError):
      return seen
    seen = seen.__cause__ or seen.__context__
  return None


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
