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
