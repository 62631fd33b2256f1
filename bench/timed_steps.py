"""A jitted train step timed over repeated calls on one batch: what the step benches share."""

from __future__ import annotations

import time
from typing import Any, Callable


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
