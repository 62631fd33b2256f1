"""The serve program: the job's checkpoint (or its `train.init_from` weights) behind an
OpenAI-style HTTP API, decoding with continuous batching over the `decode.*` slots.

  --mode=serve --job_log_dir=runs/smol                      http://127.0.0.1:8000/v1/...
  --mode=serve --exp=SmolLM2Instruct --job_log_dir=runs/smol_serve --port=0   (a free port)

Routes and request fields: lingvo_lite/serving/app.py and openai_api.py; the engine that owns
the device: serving/engine.py. One host serves: a multi-host mesh is out of scope (the engine
thread drives this process's devices only).

The port is taken (bound) before the model loads, so that a port in use is one line, early;
it starts listening only once the model is loaded and compiled, so that no client waits on a
server that may never come, and every failure before serving (an unreadable or corrupt weight
file, a decode state that does not fit) closes it: one line, exit 2 (1 for a failure after
start, as every program), and nothing is left bound or listening.

Prints `serving MODEL on http://HOST:PORT` once the port is open and the first compiles are
done. SIGTERM or Ctrl-C stops accepting connections, lets the requests in flight finish for up
to --shutdown_timeout_s (then cancels the rest), and exits 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import signal
import socket
import sys
from typing import Any, Iterator

from lingvo_lite.errors import UsageError
from lingvo_lite.programs import Invocation, record_config_where_missing, refuse_model_changes
from lingvo_lite.programs.options import checkpoint_step_option, init_from_option, option
from lingvo_lite.runtime.job_dirs import JobFiles
from lingvo_lite.weights import sources


@dataclasses.dataclass(frozen=True)
class Options:
  """The flags of --mode=serve."""

  checkpoint_step: int | None = checkpoint_step_option()
  init_from: str | None = init_from_option()
  host: str = option("127.0.0.1", "--mode=serve: the address to listen on (a warning when it "
                     "is not loopback: the server has no authentication).", non_empty=True)
  port: int = option(8000, "--mode=serve: the TCP port (0: a free one, printed).")
  served_model_name: str | None = option(
      None, "--mode=serve: the model's name in the API (default: the job dir's name).",
      non_empty=True)
  max_outstanding: int = option(
      256, "--mode=serve: most generation requests (choices) waiting or running at once; "
      "more are answered 429.")
  request_timeout_s: float = option(
      600.0, "--mode=serve: a request still running after this many seconds is cancelled "
      "(504).")
  shutdown_timeout_s: float = option(
      30.0, "--mode=serve: on SIGTERM, how long requests in flight may still finish.")

  def config_parts(self, cfg: Any) -> dict[str, Any]:
    return sources.config_parts(self.init_from, cfg)


JOB_FILES = JobFiles(records_config=True)


def _check(options: Options) -> None:
  if not 0 <= options.port <= 65535:
    raise UsageError(f"--port={options.port}: not a TCP port; give 0 to 65535 (0: a free one)")
  if options.max_outstanding < 1:
    raise UsageError(f"--max_outstanding={options.max_outstanding}: must be at least 1")
  for name in ("request_timeout_s", "shutdown_timeout_s"):
    value = getattr(options, name)
    if not value > 0 or value == float("inf"):
      raise UsageError(f"--{name}={value}: give a positive number of seconds")


def _cannot_listen(host: str, port: int, error: Exception) -> UsageError:
  return UsageError(f"--host={host} --port={port}: cannot listen there ({error}); give another "
                    "--port (0 picks a free one) or --host")


def _bind(host: str, port: int) -> socket.socket:
  """The server's socket, bound and not yet listening (`_listen`): taken before the model
  loads, so a port in use is one line, early; the caller closes it on every path."""
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  try:
    listener = socket.socket(family, socket.SOCK_STREAM)
  except OSError as e:
    raise _cannot_listen(host, port, e) from None
  try:
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
  # TypeError: a host name that cannot be encoded (`--host=$'\xff'`, a NUL from a flag file);
  # UnicodeError (a ValueError): one that IDNA cannot encode.
  except (OSError, OverflowError, TypeError, ValueError) as e:
    listener.close()
    raise _cannot_listen(host, port, e) from None
  return listener


def _listen(listener: socket.socket, host: str, port: int) -> None:
  """Starts accepting connections, once the model is ready (another process may have taken
  the port meanwhile: binding with SO_REUSEADDR reserves it only against listeners)."""
  try:
    listener.listen(128)
  except OSError as e:
    raise _cannot_listen(host, port, e) from None


def _is_loopback(host: str) -> bool:
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return host == "localhost"


def _quiet_exit_server_class() -> type:
  import uvicorn  # pylint: disable=g-import-not-at-top

  class QuietExitServer(uvicorn.Server):
    """uvicorn's server, except that a SIGTERM or SIGINT it shut down for is not raised again
    afterwards (uvicorn re-raises it, so the process would die by the signal): a server asked
    to stop that stopped cleanly exits 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
      originals = {sig: signal.signal(sig, self.handle_exit)
                   for sig in (signal.SIGINT, signal.SIGTERM)}
      try:
        yield
      finally:
        for sig, handler in originals.items():
          signal.signal(sig, handler)

  return QuietExitServer


def main(invocation: Invocation) -> None:
  options: Options = invocation.options
  _check(options)
  refuse_model_changes(invocation, "serve")
  # Closed on every way out: a load that fails (an unreadable weight file) must leave nothing
  # bound, whatever it raised, in a process that lives on (the harness, tests) as in one that
  # exits.
  with _bind(options.host, options.port) as listener:
    _serve(invocation, options, listener)


def _serve(invocation: Invocation, options: Options, listener: socket.socket) -> None:
  """Loads the model, then serves on the bound `listener` until SIGTERM or Ctrl-C."""
  # Imported here: the HTTP stack is needed by this program only.
  import uvicorn  # pylint: disable=g-import-not-at-top
  from lingvo_lite.serving import app as serving_app, engine as serving_engine, loaded_model  # pylint: disable=g-import-not-at-top

  if not _is_loopback(options.host):
    print(f"warning: --host={options.host} is not loopback: anyone who can reach it can use "
          "the model (no authentication)", file=sys.stderr, flush=True)
  model = loaded_model.load(invocation.setup, invocation.job_dir,
                            invocation.shown_job_dir, options.checkpoint_step)
  record_config_where_missing(invocation)
  name = options.served_model_name or invocation.job_dir.name
  with model.generator.activated():
    model.generator.warm([1])  # The generate loop and the smallest prefill, before serving.
  _listen(listener, options.host, options.port)
  engine = serving_engine.Engine(model, options.max_outstanding)
  engine.start()
  try:
    server = serving_app.Server(engine, name, options.request_timeout_s)
    config = uvicorn.Config(server.app(), log_level="warning", access_log=False,
                            timeout_graceful_shutdown=options.shutdown_timeout_s)
    http = _quiet_exit_server_class()(config)
    host, port = listener.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host
    print(f"serving {name} ({model.weights}) on http://{shown_host}:{port}", flush=True)
    http.run(sockets=[listener])
  finally:
    engine.stop(timeout=options.shutdown_timeout_s)
  print(f"stopped serving {name}", flush=True)
