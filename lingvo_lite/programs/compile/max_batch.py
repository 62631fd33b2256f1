"""The largest per-device batch whose step fits the target, found with few compiles.

A step's memory grows about linearly in its batch: the state is fixed, activations and
temporaries scale with the rows. Two compiles give the line, the line predicts the largest
batch that fits, and real compiles confirm it and the batch one past it (which must not fit).
Where the line is off (XLA changes its fusion or layout choices with the shape), the search
refits through the two measurements nearest the boundary, and bisects if a prediction
repeats, so it ends with a boundary checked by compiles on both sides: `fits(b)` and
`not fits(b + u)`, the same answer a brute-force search gives for memory that grows with b.
Batches step by u, the smallest per-device batch the mesh and micro-batching accept (1 for
plain data parallelism; 16 for 16 micro-batches over 8 chips).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from lingvo_lite import target as targets
from lingvo_lite.experiment import Setup
from lingvo_lite.on_mesh import evaluation
from lingvo_lite.programs.compile import aot, compile_report
from lingvo_lite.runtime import progress

# A search that has not closed the boundary after this many compiles reports where it is.
MAX_COMPILES = 16


def _with_batch(setup: Setup, program: str, per_device: int, num_devices: int) -> Setup:
  if program == "train":
    return dataclasses.replace(setup, train_data=dataclasses.replace(
        setup.train_data, global_batch_size=per_device * num_devices,
        per_device_batch_size=None))
  name, data = evaluation.largest_set(setup)
  return evaluation.replace_set(setup, name, dataclasses.replace(
      data, global_batch_size=per_device * num_devices, per_device_batch_size=None))


@dataclasses.dataclass(frozen=True)
class Row:
  """One setup to search: a choice of a setting (setting_tables.py: a remat policy, an optimizer
  option), or the config's own.

  Attributes:
    column: The setting's field in the report ("remat_policy", "optimizer_option").
    name: The choice.
    setup: The config with it.
    first: Its compile at the configured batch, where one was made.
  """

  column: str
  name: str
  setup: Setup
  first: aot.CompileResult | None = None


def search(target: targets.Target, program: str, rows: list[Row]) -> dict[str, Any]:
  """The search for each row, as report data; each starts from its compile at the
  configured batch where one was made."""
  return {"policies": [{row.column: row.name, **_search(row, target, program)}
                       for row in rows]}


def _unit(setup: Setup, program: str, target: targets.Target) -> int:
  """The smallest per-device batch the mesh and the micro-batching accept; valid batches
  are its multiples (the global batch must split over grad_accum_steps x data-parallel
  micro-batch rows and over the processes)."""
  data_parallel = setup.partitioner.data_parallel_size(
      setup.partitioner.mesh_axis_sizes(target.num_devices))
  accum = setup.train.grad_accum_steps if program == "train" else 1
  rows = math.lcm(accum * data_parallel, target.num_processes)
  return rows // math.gcd(rows, target.num_devices)


def _search(row: Row, target: targets.Target, program: str) -> dict[str, Any]:
  """Searches k, the per-device batch in units of `_unit` (1 for plain data parallelism)."""
  setup, first = row.setup, row.first
  data = setup.train_data if program == "train" else evaluation.largest_set(setup)[1]
  num_devices, unit = target.num_devices, _unit(setup, program, target)
  compiles: dict[int, dict[str, Any]] = {}  # By k.
  # A compile can take a minute: after the first seconds, a line per compile made.
  searching = progress.Progress(f"max batch search ({row.name})", unit="compiles",
                                interval=0)

  def record(k: int, result: aot.CompileResult) -> dict[str, Any]:
    report = compile_report.build(result)
    compiles[k] = {"per_device_batch_size": k * unit, "bytes": report["memory"]["deciding"],
                   "available": report["memory"]["available"],
                   "fits": report["verdict"] == compile_report.FITS, "seconds": result.seconds}
    return compiles[k]

  def measure(k: int) -> dict[str, Any]:
    if k not in compiles:
      candidate = _with_batch(setup, program, k * unit, num_devices)
      with targets.active(target):
        candidate.validate(target)
      made = record(k, aot.compile_step(candidate, target, program))
      needs = "" if made["bytes"] is None else f"{made['bytes'] / 2**30:.2f} GiB, "
      searching.update(1, f"per-device batch {k * unit}: {needs}"
                       f"{'fits' if made['fits'] else 'does not fit'}")
    return compiles[k]

  per_device, remainder = divmod(data.global_batch_size, num_devices)
  if first is not None and not remainder and per_device % unit == 0:
    record(per_device // unit, first)  # The report's own compile is one of the points.
  with searching:
    best, line, note = find_largest(
        measure, compiles, f"even a per-device batch of {unit} (the smallest valid) does not fit")
  if line is not None:
    line = {"bytes_at_zero": line["bytes_at_zero"],
            "bytes_per_row": line["bytes_per_unit"] / unit}
  return _finish(unit, compiles, best, line, note)


def find_largest(measure: Callable[[int], dict[str, Any]], compiles: dict[int, dict[str, Any]],
                 smallest_does_not_fit: str
                 ) -> tuple[int | None, dict[str, float] | None, str]:
  """The search of the module doc over k = 1, 2, ... units (of batch rows, or decode slots).

  Args:
    measure: Compiles at k units (once; it records into `compiles`) and returns the record:
      `bytes` (the verdict's per-device number, None without an analysis), `available`,
      `fits`.
    compiles: The records made so far, by k (the report's own compile may be one).
    smallest_does_not_fit: The note where even k = 1 does not fit.

  Returns:
    (the largest k that fits, 0 where none does, None without an analysis; the fitted line,
    bytes per device at zero units and per unit; a note where the search fell short).
  """
  for k in (1, 2):
    if len(compiles) >= 2:
      break
    measure(k)
  if any(c["bytes"] is None for c in compiles.values()):
    return None, None, "XLA reported no memory analysis"
  if not measure(1)["fits"]:
    return 0, None, smallest_does_not_fit

  fitting, failing = _bounds(compiles)
  line = None
  crept = False  # The last prediction fit without closing the boundary.
  while (failing is None or failing > fitting + 1) and len(compiles) < MAX_COMPILES:
    guess, slope, fitted, bisect = _next_guess(compiles, fitting, failing, crept)
    line = fitted or line
    fits = measure(guess)["fits"]
    if fits and slope > 0 and guess + 1 not in compiles and (
        failing is None or guess + 1 < failing):
      fits = measure(guess + 1)["fits"]  # The prediction and one step beyond it.
    crept = not bisect and fits and failing is not None
    fitting, failing = _bounds(compiles)
  note = "" if failing == fitting + 1 else f"boundary not closed after {len(compiles)} compiles"
  return fitting, line, note


def _bounds(compiles: dict[int, dict[str, Any]]) -> tuple[int, int | None]:
  """(the largest k that fits, the smallest that does not or None) of the compiles so far."""
  fitting = max(k for k, c in compiles.items() if c["fits"])
  failing = min((k for k, c in compiles.items() if not c["fits"]), default=None)
  return fitting, failing


def _next_guess(compiles: dict[int, dict[str, Any]], fitting: int, failing: int | None,
                crept: bool) -> tuple[int, float, dict[str, float] | None, bool]:
  """(the k to compile next, the slope of the line through two measurements, that line where
  memory grows with k (else None), whether k halves the interval instead of following it)."""
  if failing is not None:  # The line through the two measurements around the boundary.
    k1, k2 = fitting, failing
  else:
    k1, k2 = sorted(compiles)[-2:]
  y1, y2 = compiles[k1]["bytes"], compiles[k2]["bytes"]
  slope = (y2 - y1) / (k2 - k1)
  line = None
  if slope > 0:
    line = {"bytes_at_zero": y1 - slope * k1, "bytes_per_unit": slope}
    # The least memory any compile was given: XLA:TPU's own limit (15.75 of a v5e's
    # 16 GiB) comes with the first compile it refuses.
    available = min(c["available"] for c in compiles.values())
    guess = int((available - line["bytes_at_zero"]) // slope)
  else:  # Tiny batches are all fixed cost: step out until memory grows.
    guess = fitting * 4
  high = failing if failing is not None else max(guess + 2, fitting * 2)
  guess = min(max(guess, fitting + 1), high - 1)
  bisect = guess in compiles or crept
  if bisect:
    # Where the line misleads (XLA's choices change with the shape) its predictions creep
    # a unit or two a compile: after one that fit without closing the boundary, halve.
    guess = (fitting + high) // 2
  return guess, slope, line, bisect


def _finish(unit: int, compiles: dict[int, dict[str, Any]], best: int | None,
            line: dict[str, float] | None, note: str) -> dict[str, Any]:
  """The search's result: the largest fitting per-device batch (rows), the fitted line
  (bytes at zero rows and per row, per device) and every compile made."""
  return {"max_per_device_batch_size": None if best is None else best * unit,
          "per_device_unit": unit, "line": line, "note": note,
          "compiles": [compiles[k] for k in sorted(compiles)]}

