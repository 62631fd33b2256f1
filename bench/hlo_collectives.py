"""Which collectives make a compiled step's ICI term: the step estimate's own walker and byte
rules (programs/compile/step_estimate.py, collective_costs.py) over an optimized HLO dump,
each collective's bytes per device times the trips of the loops around it, ranked.

  XLA_FLAGS="--xla_dump_to=DUMP --xla_dump_hlo_module_re=.*train_step.*" \\
      python -m lingvo_lite --exp=... --mode=compile --compile_topology=v5e-256 ...
  python bench/hlo_collectives.py DUMP/module_*jit_train_step*.after_optimizations.txt [--top 25]

`channel` is the collective's channel id: XLA:TPU runs an asynchronous collective as a start
fusion and "continued" fusions that each hold the same collective instruction (one channel);
the estimate pairs them within one computation, so copies of one channel in a loop body whose
start is outside it are each counted as a whole collective (`copies` > 1 with many trips).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from lingvo_lite import chips
from lingvo_lite.programs.compile import collective_costs, hlo_text, step_estimate
# pylint: enable=wrong-import-position


def loop_trips(module: hlo_text.Module) -> collections.Counter:
  """How many times each computation runs per step (loop trips multiplied through)."""
  times: collections.Counter = collections.Counter()

  def walk(name: str, count: float) -> None:
    times[name] += count
    for instruction in module.computations[name].instructions:
      if instruction.opcode == "while":
        body = (instruction.attribute("body") or "").lstrip("%")
        if body in module.computations:
          walk(body, count * (hlo_text.trip_count(module, instruction) or 1))
        continue
      for called in instruction.called():
        if called in module.computations:
          walk(called, count)
  walk(module.entry, 1.0)
  return times


def ranked(path: str, devices: int, chip: str) -> tuple[float, list[tuple]]:
  """(total ICI bytes per device, rows of (bytes, trips, kind, shape, channel, op_name,
  copies of the channel)), the bytes as the estimate counts them."""
  module = hlo_text.parse(open(path, encoding="utf-8").read())
  times = loop_trips(module)
  rows: collections.Counter = collections.Counter()
  trips: collections.Counter = collections.Counter()
  counted = step_estimate._Walker._collective  # pylint: disable=protected-access

  def recording(walker, instruction, kind):
    totals = counted(walker, instruction, kind)
    meta = re.search(r'op_name="([^"]*)"', instruction.attributes)
    op = (meta.group(1) if meta else "").replace("jit(train_step)/", "")[-110:]
    shape = instruction.shape[0] if instruction.shape else None
    key = (kind, f"{shape.dtype}{list(shape.dims)}" if shape else "",
           instruction.attribute("channel_id") or "", op)
    rows[key] += totals.ici_bytes * times[instruction.computation]
    trips[key] += times[instruction.computation]
    return totals

  step_estimate._Walker._collective = recording  # pylint: disable=protected-access
  network = collective_costs.Network(tuple([0] * devices), tuple([None] * devices))
  step_estimate._Walker(module, chips.CHIPS[chip], network).computation(module.entry)  # pylint: disable=protected-access
  step_estimate._Walker._collective = counted  # pylint: disable=protected-access
  # Each channel's collective instructions in the module (copies of one asynchronous one).
  copies: collections.Counter = collections.Counter()
  for computation in module.computations.values():
    for i in computation.instructions:
      channel = i.attribute("channel_id")
      if collective_costs.kind_of(i.opcode) and channel and times[i.computation]:
        copies[channel] += 1
  out = [(moved, trips[key], *key, copies[key[2]] or 1) for key, moved in rows.most_common()]
  return sum(rows.values()), out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("hlo")
  parser.add_argument("--devices", type=int, default=256)
  parser.add_argument("--chip", default="v5e")
  parser.add_argument("--top", type=int, default=25)
  args = parser.parse_args()
  total, rows = ranked(args.hlo, args.devices, args.chip)
  print(f"ICI bytes per device as the estimate counts them: {total / 1e12:.3f} TB")
  for moved, count, kind, shape, channel, op, copies in rows[:args.top]:
    print(f"{moved / 1e9:9.1f} GB  x{count:7.0f}  {kind:14s} {shape:24s} channel "
          f"{channel or '-'} (copies {copies})  {op}")

if __name__ == "__main__":
  main()
