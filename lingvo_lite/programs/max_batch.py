"""The largest per-device batch whose step fits the target, found with few compiles.

A step's memory grows about linearly in its batch: the state is fixed, activations and
temporaries scale with the rows. Two compiles give the line, the line predicts the largest
batch that fits, and real compiles confirm it and the batch one past it (which must not fit).
Where the line is off (XLA changes its fusion or layout choices with the shape), the search
refits through the two measurements nearest the boundary, and bisects if a prediction
repeats, so it ends with a boundary checked by compiles on both sides: `fits(b)` and
`not fits(b + 1)`, the same answer a brute-force search gives for memory that grows with b.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lingvo_lite import target as targets
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup
from lingvo_lite.models.transformer import REMAT_POLICIES
from lingvo_lite.programs import aot, compile_report

# A search that has not closed the boundary after this many compiles reports where it is.
MAX_COMPILES = 16


def check_policies(names: list[str]) -> list[str]:
  valid = ("none", *REMAT_POLICIES)
  for name in names:
    if name not in valid:
      raise UsageError(f"--compile_remat_policies={','.join(names)}: unknown policy {name!r}; "
                       f"valid: {', '.join(valid)}")
  return list(dict.fromkeys(names))


def _with_batch(setup: Setup, program: str, per_device: int, num_devices: int) -> Setup:
  name = "train_data" if program == "train" else "eval_data"
  data = dataclasses.replace(getattr(setup, name), global_batch_size=per_device * num_devices,
                             per_device_batch_size=None)
  return dataclasses.replace(setup, **{name: data})


def search(setup: Setup, target: targets.Target, program: str, policies: list[str],
           first: aot.CompileResult) -> dict[str, Any]:
  """The search per remat policy (the config's own when none are given), as report data."""
  rows = []
  for policy in policies or [setup.model.remat_policy]:
    searched = setup
    if policy != setup.model.remat_policy:
      searched = dataclasses.replace(setup, model=setup.model.clone(remat_policy=policy))
    rows.append(_search(searched, target, program, first if searched is setup else None))
  return {"policies": rows}


def _search(setup: Setup, target: targets.Target, program: str,
            first: aot.CompileResult | None) -> dict[str, Any]:
  data = setup.train_data if program == "train" else setup.eval_data
  num_devices = target.num_devices
  compiles: dict[int, dict[str, Any]] = {}

  def measure(per_device: int) -> dict[str, Any]:
    if per_device not in compiles:
      candidate = _with_batch(setup, program, per_device, num_devices)
      try:
        with targets.active(target):
          candidate.validate(target)
      except UsageError as e:
        compiles[per_device] = {"per_device_batch_size": per_device, "valid": False,
                                "reason": str(e)}
        return compiles[per_device]
      result = aot.compile_step(candidate, target, program)
      report = compile_report.build(result)
      compiles[per_device] = {
          "per_device_batch_size": per_device, "valid": True,
          "bytes": report["memory"]["deciding"], "available": report["memory"]["available"],
          "fits": report["verdict"] == compile_report.FITS, "seconds": result.seconds}
    return compiles[per_device]

  if first is not None and data.global_batch_size % num_devices == 0:
    # The report's own compile is one of the two points, when its batch is whole per device.
    report = compile_report.build(first)
    per_device = data.global_batch_size // num_devices
    compiles[per_device] = {
        "per_device_batch_size": per_device, "valid": True,
        "bytes": report["memory"]["deciding"], "available": report["memory"]["available"],
        "fits": report["verdict"] == compile_report.FITS, "seconds": first.seconds}
  for per_device in (1, 2):
    if len([c for c in compiles.values() if c.get("bytes") is not None]) >= 2:
      break
    measure(per_device)
  if any(c.get("bytes") is None for c in compiles.values() if c["valid"]):
    return _finish(setup, compiles, None, None, "XLA reported no memory analysis")
  if not measure(1).get("fits", False):
    return _finish(setup, compiles, 0, None, "even a batch of 1 per device does not fit")

  fitting = max(b for b, c in compiles.items() if c.get("fits"))
  failing = min((b for b, c in compiles.items() if c["valid"] and not c["fits"]), default=None)
  line = None
  while failing is None or failing > fitting + 1:
    if len(compiles) >= MAX_COMPILES:
      break
    measured = {b: c["bytes"] for b, c in compiles.items() if c.get("bytes") is not None}
    if failing is not None:  # The line through the two measurements around the boundary.
      b1, b2 = fitting, failing
    else:
      b1, b2 = sorted(measured)[-2:] if len(measured) > 1 else (fitting, fitting)
    y1, y2 = measured[b1], measured[b2]
    slope = (y2 - y1) / (b2 - b1) if b2 != b1 else 0
    available = compiles[fitting]["available"]
    if slope > 0:
      line = {"bytes_at_zero": y1 - slope * b1, "bytes_per_row": slope}
      guess = int((available - line["bytes_at_zero"]) // slope)
    else:
      guess = fitting * 2
    high = failing if failing is not None else max(guess + 2, fitting * 2)
    guess = min(max(guess, fitting + 1), high - 1)
    if guess in compiles:
      guess = (fitting + high) // 2
    if measure(guess).get("fits") and guess + 1 not in compiles and (
        failing is None or guess + 1 < failing):
      measure(guess + 1)  # The prediction and one step beyond it.
    fitting = max(b for b, c in compiles.items() if c.get("fits"))
    failing = min((b for b, c in compiles.items() if c["valid"] and not c["fits"]),
                  default=None)
    if failing is not None and all(
        not c["valid"] for b, c in compiles.items() if fitting < b < failing):
      break  # Only batches validate() refuses lie between.
  note = "" if failing == fitting + 1 else (
      f"boundary not closed after {len(compiles)} compiles" if failing is None or
      len(compiles) >= MAX_COMPILES else "the batches in between are not valid for this mesh")
  return _finish(setup, compiles, fitting, line, note)


def _finish(setup: Setup, compiles: dict[int, dict[str, Any]], best: int | None,
            line: dict[str, float] | None, note: str) -> dict[str, Any]:
  return {"remat_policy": setup.model.remat_policy, "max_per_device_batch_size": best,
          "line": line, "note": note,
          "compiles": [compiles[b] for b in sorted(compiles)]}


def to_text(data: dict[str, Any]) -> list[str]:
  lines = ["  largest per-device batch that fits:",
           "    remat policy                        max per device  compiles (batch: GiB, fits)"]
  for row in data["policies"]:
    made = ", ".join(
        f"{c['per_device_batch_size']}: " + (f"{c['bytes'] / 2**30:.2f} {'yes' if c['fits'] else 'no'}"
                                             if c["valid"] else "invalid")
        for c in row["compiles"])
    best = row["max_per_device_batch_size"]
    lines.append(f"    {row['remat_policy']:<35} {'n/a' if best is None else best:>14}  {made}"
                 + (f"  ({row['note']})" if row["note"] else ""))
  return lines
