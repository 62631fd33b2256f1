"""A request's body, from the client's bytes to JSON values every route can trust: the one
place where bytes become Python values, so no route meets a value the checks below let pass.

A body is refused (`RequestError`, a 4xx naming `body` or the field) when it is
  - larger than MAX_BODY_BYTES (413);
  - cut short: the client closed the connection before the bytes its Content-Length promised
    (499, as nginx names a request its client left);
  - not UTF-8 (JSON over HTTP is UTF-8, RFC 8259), or not JSON;
  - nested deeper than MAX_DEPTH: no field of the API nests past 3 levels, and a body of a
    hundred thousand `[` would exhaust Python's recursion while being parsed, or later in any
    code that walks it;
  - holding text that is not Unicode anywhere, key or value: JSON's `\\ud800` escape decodes
    to a lone surrogate, which no tokenizer encodes and no UTF-8 answer can echo.

Fields are named as a client writes them: `messages[0].content`, `prompt[2]`, `stop`.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import ClientDisconnect, Request as HttpRequest

from lingvo_lite.serving.openai_api import RequestError

MAX_BODY_BYTES = 16 * 2**20
MAX_DEPTH = 32


async def read(request: HttpRequest) -> Any:
  """The request's body as checked JSON values.

  Raises:
    RequestError: naming `body` (or the field that holds bad text or nests too deep).
  """
  declared = request.headers.get("content-length")
  if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
    raise RequestError("body", f"{declared} bytes; at most {MAX_BODY_BYTES}", status=413)
  data = bytearray()
  try:
    async for part in request.stream():
      data += part
      if len(data) > MAX_BODY_BYTES:
        raise RequestError("body", f"over {MAX_BODY_BYTES} bytes", status=413)
  except ClientDisconnect:
    # The client went away mid-body (fewer bytes than its Content-Length, then a close): its
    # mistake, answered 499 as a client that leaves mid-generation is, never logged as the
    # server's failure with a traceback.
    raise RequestError("body", f"the client closed the connection after {len(data)} bytes, "
                       "before the body ended", status=499) from None
  return decode(bytes(data))


def decode(data: bytes) -> Any:
  """`data` as JSON values, checked as the module doc says.

  Raises:
    RequestError: naming `body` or the field.
  """
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise RequestError("body", f"not UTF-8: byte {data[e.start]:#04x} at offset {e.start}; "
                       "send the JSON as UTF-8") from None
  try:
    value = json.loads(text)
  except RecursionError:  # Python's parser recurses once per level.
    raise RequestError("body", f"nested deeper than {MAX_DEPTH} levels") from None
  except ValueError as e:
    raise RequestError("body", f"not valid JSON ({e})") from None
  _check_values(value)
  return value


def _check_values(body: Any) -> None:
  """Refuses text that is not Unicode and nesting past MAX_DEPTH, walking `body` without
  recursion (a deep body must not exhaust the stack that checks it)."""
  pending = [(body, "", 0)]
  while pending:
    value, path, depth = pending.pop()
    if depth > MAX_DEPTH:
      top = path.split("[", 1)[0].split(".", 1)[0]
      raise RequestError(top or "body", f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
      _check_text(value, path or "body")
    elif isinstance(value, list):
      pending.extend((item, f"{path or 'body'}[{i}]", depth + 1)
                     for i, item in enumerate(value))
    elif isinstance(value, dict):
      for key, item in value.items():
        _check_text(key, path or "body", "a key ")
        pending.append((item, f"{path}.{key}" if path else key, depth + 1))


def _check_text(text: str, field: str, which: str = "") -> None:
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    raise RequestError(field, f"{which}holds {text[e.start]!r} at character {e.start}, a lone "
                       "surrogate (JSON's \\ud800 to \\udfff without its pair), which is not "
                       "text; send valid Unicode") from None
