"""Runs executor command lines in one child process and prints, as one JSON line, each one's
exit code, stderr and the functions XLA compiled meanwhile (from jax.monitoring's backend
compile event, which fires on every compile, a persistent-cache hit included). The parent
(tests/programs/test_compile.py) sets XLA_FLAGS for 8 CPU devices and asserts on the result.
Its runs use the suite's compilation cache: a hit is still that event, so a run that compiles
the train step shows it either way, and one compiled from the cache is an executable XLA
made from the same program (~8 s less a test on 2 cores than compiling without the cache).

  python -m tests.compiled_step_worker '[["--exp=...", ...], ...]'
"""

import json
import sys

import jax

from lingvo_lite.testing import run_cli

_COMPILED: list[str] = []


def _listener(event: str, duration: float, **kwargs) -> None:
  del duration
  if event == "/jax/core/compile/backend_compile_duration":
    _COMPILED.append(str(kwargs.get("fun_name", "")))


def main() -> None:
  jax.monitoring.register_event_duration_secs_listener(_listener)
  results = []
  for args in json.loads(sys.argv[1]):
    _COMPILED.clear()
    result = run_cli(args)
    results.append({"code": result.code, "stderr": result.stderr, "compiled": list(_COMPILED)})
  print(json.dumps(results))


if __name__ == "__main__":
  main()
