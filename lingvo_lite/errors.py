"""User errors: wrong commands or configs, reported as one line and exit code 2.

Anything raised as `UsageError` is the user's to fix (an unknown name, a bad value, a failed
`Setup.validate()`), so the executor prints its message without a traceback. Every message
names the field, the value and the fix or the valid choices.
"""


class UsageError(Exception):
  """A command-line or config mistake, detected before any device time is spent."""


def config_error(path: str, value: object, problem: str, fix: str = "") -> UsageError:
  """Builds the house-style message: `<path>=<value>: <problem>[; <fix>]`."""
  message = f"{path}={value!r}: {problem}"
  if fix:
    message += f"; {fix}"
  return UsageError(message)
