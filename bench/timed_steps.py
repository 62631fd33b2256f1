"""What the step benches share: their arguments (two sides timed in pairs), and a jitted train
step timed over repeated calls on one batch."""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

_WARMUP_HELP = "untimed steps each side runs first (at least 1: it compiles)"
_SET_HELP = "PATH=VALUE override of the lingvo_lite config (repeatable)"


def paired_parser(doc: str, experiment: str, steps: int, warmup: int = 2,
                  helps: dict[str, str] | None = None) -> argparse.ArgumentParser:
  """A parser with the arguments of a bench that times sides in pairs: --experiment, --pairs,
  --steps, --warmup and --set; the bench adds its own before `parse_paired`.

  Args:
    doc: The bench's module docstring (its first line is the description).
    experiment: The default --experiment.
    steps: The default --steps (steps per timed measurement).
    warmup: The default --warmup (untimed steps each side runs first).
    helps: Argument name ("pairs", "steps", "warmup", "set") -> its help, where the bench
      says more than the default.
  """
  helps = {"warmup": _WARMUP_HELP, "set": _SET_HELP, **(helps or {})}
  parser = argparse.ArgumentParser(description=doc.splitlines()[0])
  parser.add_argument("--experiment", default=experiment)
  parser.add_argument("--pairs", type=int, default=7, help=helps.get("pairs"))
  parser.add_argument("--steps", type=int, default=steps, help=helps.get("steps"))
  parser.add_argument("--warmup", type=int, default=warmup, help=helps["warmup"])
  parser.add_argument("--set", action="append", default=[], help=helps["set"])
  return parser


def parse_paired(parser: argparse.ArgumentParser) -> argparse.Namespace:
  """The command line's arguments; --pairs, --steps or --warmup below 1 is a usage error (the
  first warm-up step compiles, and a median needs a pair)."""
  args = parser.parse_args()
  if args.warmup < 1 or args.pairs < 1 or args.steps < 1:
    parser.error("--warmup, --pairs and --steps must be at least 1")
  return args


def timed_train_steps(jitted: Any, state: Any, batch: Any) -> Callable[[int], float]:
  """A function running `n` of `jitted`'s train steps on `batch`, the state carried from call
  to call (the steps donate it), that returns the seconds per step."""
  import jax  # pylint: disable=g-import-not-at-top  # The benches set up devices first.
  held = [state]

  def run(num_steps: int) -> float:
    with jitted.activated():
      started = time.perf_counter()
      for _ in range(num_steps):
        held[0], metrics = jitted.train_step(held[0], batch)
      jax.block_until_ready(metrics["loss"])
    return (time.perf_counter() - started) / num_steps
  return run


def each_step_seconds(step: Callable, state: Any, batch: Any, steps: int, warmup: int = 2
                      ) -> tuple[list[float], Any, Any]:
  """`warmup` untimed calls of a compiled train step (the first settle allocation), then the
  seconds of each of `steps` calls, each waited for: (the seconds, the state, the last
  metrics). The step donates its state, so the one returned is the one to go on with."""
  import jax  # pylint: disable=g-import-not-at-top  # The benches set up devices first.
  for _ in range(warmup):
    state, metrics = step(state, batch)
  jax.block_until_ready(metrics["loss"])
  seconds = []
  for _ in range(steps):
    started = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics["loss"])
    seconds.append(time.perf_counter() - started)
  return seconds, state, metrics
