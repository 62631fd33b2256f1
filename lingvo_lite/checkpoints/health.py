"""Which saved steps were healthy: the step a diverged run should resume from.

A run whose loss goes non-finite saves no non-finite state, but a finite state can have
diverged already (parameters around 1e9): resumed with a lower learning rate, it goes
non-finite again at once. So a step is judged by what its state did next:

  A checkpoint is healthy when the first loss logged after it (the first computed from its
  state, or soon after) is finite and at most LOSS_FACTOR times the lowest loss logged up to
  then, and the gradient norm logged with it (where one is) finite and at most
  GRAD_NORM_FACTOR times the lowest logged up to then.

A step with no row after it yet is not judged (a run that stops there counts as a failed row).
The rows are the train metrics: this run's as it logs them and, on a resume, the job's
`metrics.jsonl` rows up to the restored step (those of verified checkpoints), so the lowest
loss of the whole run is known after a restart. The train program keeps the newest healthy
step through checkpoint retention (`Checkpointer.also_keep`) and names it when a run diverges.
"""

from __future__ import annotations

import bisect
import math
from typing import Iterable, Mapping

LOSS_FACTOR = 2.0
GRAD_NORM_FACTOR = 100.0
RULE = (f"the first loss logged after it is finite and at most {LOSS_FACTOR:g}x the lowest "
        f"logged loss, its gradient norm finite and at most {GRAD_NORM_FACTOR:g}x the lowest")


def _finite(value: float | None) -> bool:
  return value is not None and math.isfinite(value)


class TrainingHealth:
  """The logged losses and gradient norms, in step order, and the rule over them."""

  def __init__(self, rows: Iterable[Mapping[str, float]] = ()):
    self._steps: list[int] = []
    self._healthy: list[bool] = []  # Of each row, against the lowest values up to it.
    self._lowest_loss = math.inf
    self._lowest_grad_norm = math.inf
    for row in sorted(rows, key=lambda row: row["step"]):
      self.add(int(row["step"]), row.get("loss"), row.get("grad_norm"))

  def add(self, step: int, loss: float | None, grad_norm: float | None = None) -> None:
    """A logged row (steps in increasing order; a row for a step already seen replaces the
    rows from there on, as a resumed run's do)."""
    cut = bisect.bisect_left(self._steps, step)
    if cut < len(self._steps):  # Not expected in a run; the lowest values stay as they are.
      del self._steps[cut:], self._healthy[cut:]
    if _finite(loss):
      self._lowest_loss = min(self._lowest_loss, loss)
    if _finite(grad_norm):
      self._lowest_grad_norm = min(self._lowest_grad_norm, grad_norm)
    healthy = _finite(loss) and loss <= LOSS_FACTOR * self._lowest_loss and (
        grad_norm is None or (_finite(grad_norm)
                              and grad_norm <= GRAD_NORM_FACTOR * self._lowest_grad_norm))
    self._steps.append(step)
    self._healthy.append(bool(healthy))

  def add_failure(self, step: int) -> None:
    """The run stopped at `step` on a non-finite loss or state: an unhealthy row."""
    self.add(step, math.nan)

  def healthy(self, step: int) -> bool | None:
    """Whether checkpoint `step` was healthy; None while no row after it is known."""
    after = bisect.bisect_right(self._steps, step)
    return self._healthy[after] if after < len(self._steps) else None

  def newest_healthy(self, steps: Iterable[int]) -> int | None:
    """The newest of `steps` known to be healthy, if any."""
    return max((step for step in steps if self.healthy(step)), default=None)
