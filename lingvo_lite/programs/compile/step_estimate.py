"""A step's time estimated from the program XLA will run: its optimized HLO, instruction by
instruction, on one chip's constants (lingvo_lite/chips.py).

The model (programs/compile/hlo_costs.py and collective_costs.py hold its terms):
  - A TensorCore runs a scheduled computation's kernels one after another: the step is the
    sum of its kernels' times, each the larger of its MXU time (matmul FLOPs over the chip's
    matmul rate, divided by the tile efficiency of its shape) and its HBM time (bytes over the
    chip's bandwidth), plus a fixed per-kernel overhead. A kernel is "compute" where the MXU
    time is the larger, "memory" where the HBM time is.
  - A while loop counts its body (and condition) once per trip: XLA's known_trip_count, or the
    loop's bounds (the scanned layers, gradient-accumulation micro-batches). Remat's
    recomputation is in the HLO, so it is counted like any other kernel.
  - Collectives cost their algorithm's bytes over ICI or DCN (collective_costs.py). Where XLA's
    schedule makes one asynchronous (`all-reduce-start` ... `all-reduce-done`, `async-start`),
    it runs beside the kernels scheduled between start and done, and only what exceeds their
    time adds to the step; so do asynchronous copies and slices (prefetches between HBM and
    vector memory). An asynchronous collective moves its bytes once per run of its start,
    however many computations or kernels it spans: XLA:TPU continues one in the fusions of a
    loop whose start and done lie outside it (a windowed einsum), and each continuation is that
    kernel's own work, not another collective; a done whose start lies elsewhere moves nothing.
  - A pipeline of p stages over m micro-batches (r circular repeats) idles each stage for
    (p - 1) / (r m + p - 1) of the pipelined loop: when the loop's bubble iterations are in the
    program (an SPMD pipeline computes them), that share of the counted time is the bubble;
    when they are not, it is added (bubble_seconds).
The estimate is per device: every device runs the same program.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

from lingvo_lite import chips
from lingvo_lite.programs.compile import collective_costs, hlo_costs, hlo_text
from lingvo_lite.programs.compile.hlo_costs import Cost
from lingvo_lite.programs.compile.hlo_text import Instruction

PARTS = ("compute", "memory", "ici", "dcn", "bubble")
# Kept estimates of another version are not read (analyses.py compiles again).
MODEL_VERSION = 3  # 2: writes alone at the read bandwidth (chips.Chip.hbm_seconds); 3: an
# asynchronous collective counted once per start, not once per continued kernel.
_COUNTS = ("flops", "hbm_bytes", "ici_bytes", "dcn_bytes", "kernels", "hbm_busy")
_COPIES = ("copy-start", "slice-start")


@dataclasses.dataclass
class Totals:
  """Time by part (exposed: what the step waits for), and what the kernels did."""

  seconds: dict[str, float] = dataclasses.field(
      default_factory=lambda: {part: 0.0 for part in PARTS})
  hidden: dict[str, float] = dataclasses.field(
      default_factory=lambda: {part: 0.0 for part in PARTS})
  flops: float = 0.0
  hbm_bytes: float = 0.0
  ici_bytes: float = 0.0
  dcn_bytes: float = 0.0
  kernels: float = 0.0
  hbm_busy: float = 0.0
  unknown_dcn: bool = False

  @property
  def total(self) -> float:
    return sum(self.seconds.values())

  def add(self, other: "Totals", times: float = 1.0) -> None:
    for part in PARTS:
      self.seconds[part] += other.seconds[part] * times
      self.hidden[part] += other.hidden[part] * times
    for name in _COUNTS:
      setattr(self, name, getattr(self, name) + getattr(other, name) * times)
    self.unknown_dcn |= other.unknown_dcn


class _Walker:
  """Walks a module's computations in schedule order, adding up their kernels."""

  def __init__(self, module: hlo_text.Module, chip: chips.Chip,
               network: collective_costs.Network):
    self.module, self.chip, self.network = module, chip, network
    self.overhead = chip.op_overhead_s.value
    self._done: dict[str, Totals] = {}
    # The module's, not one computation's: a continuation or done in a loop body belongs to a
    # start in the computation around the loop.
    self._async = _async_channels(module)

  def computation(self, name: str | None) -> Totals:
    if name not in self.module.computations:
      return Totals()  # Nothing this module prints: nothing counted.
    if name in self._done:
      return self._done[name]
    totals, pending = Totals(), {}
    for instruction in self.module.computations[name].instructions:
      role, key = self._role(instruction, pending)
      if role == "start":
        if key in pending:  # Started again before its done: the earlier run counted whole.
          totals.add(pending.pop(key)[0])
        pending[key] = (self._started(instruction), totals.total, totals.hbm_busy)
      elif role == "update":  # `async-update`: the same work, now awaited through the update.
        pending[instruction.name] = pending.pop(key)
      elif role == "waited":  # Its start, in another computation, counted the transfer.
        pass
      elif role == "done":
        started, at, busy = pending.pop(key)
        # A transfer over HBM runs in the time the kernels between leave HBM idle; one over
        # ICI or DCN beside all of their time.
        window = totals.total - at
        if started.seconds["memory"] >= max(started.seconds["ici"], started.seconds["dcn"]):
          window -= totals.hbm_busy - busy
        _overlap(totals, started, max(window, 0.0))
      elif role == "continued":  # A kernel that also advances a started collective: its own.
        _add_cost(totals, self.cost(instruction))
      else:
        self._synchronous(instruction, totals)
    for started, _, _ in pending.values():  # Never waited for here: counted whole.
      totals.add(started)
    self._done[name] = totals
    return totals

  def _role(self, instruction: Instruction, pending: dict) -> tuple[str, Any]:
    """("start" | "update" | "done" | "continued" | "waited" | "sync", the key pairing a start
    with its done). Pairs: `X-start` ... `X-done(X-start)`, `async-start` ... `async-update`
    ... `async-done`, a DCN `send` ... `send-done`, and XLA:TPU's asynchronous collective
    fusions (`async-collective-start`, kernels fused with the collective's progress,
    `async-collective-done`), paired by the collective's channel. A fused piece of a collective
    started anywhere in the module (or marked a continuation by XLA) is "continued" (its kernel
    only) or, a done not started here, "waited" (nothing): its start counts the transfer."""
    opcode, name = instruction.opcode, instruction.name
    if opcode.endswith("-start") or (opcode == "send" and "megascale" in instruction.attributes):
      return "start", name
    operand = instruction.operands[0] if instruction.operands else None
    if opcode.endswith(("-update", "-done")) and operand in pending:
      return ("update" if opcode.endswith("-update") else "done"), operand
    if opcode == "fusion":
      inner = hlo_costs.fused_collectives(self.module, self.module.called(instruction))
      if inner:
        key = _channel_key(inner[0])
        done = name.startswith("async-collective-done")
        if name.startswith("async-collective-start"):
          return "start", key
        if done and key in pending:
          return "done", key
        if key in self._async or "continuation_config" in instruction.attributes:
          return ("waited" if done else "continued"), key
    return "sync", None

  def _synchronous(self, instruction: Instruction, totals: Totals) -> None:
    opcode = instruction.opcode
    if opcode == "while":
      trips = hlo_text.trip_count(self.module, instruction)
      trips = 1 if trips is None else trips
      body, condition = ((instruction.attribute(k) or "").lstrip("%")
                         for k in ("body", "condition"))
      totals.add(self.computation(body), trips)
      totals.add(self.computation(condition), trips + 1)
    elif opcode in ("call", "conditional"):
      branches = [self.computation(c) for c in instruction.called()]
      if branches:
        totals.add(branches[0] if opcode == "call" else max(branches, key=lambda t: t.total))
    elif collective_costs.kind_of(opcode):
      totals.add(self._collective(instruction, collective_costs.kind_of(opcode)))
    elif opcode == "fusion" and hlo_costs.fused_collectives(self.module,
                                                            self.module.called(instruction)):
      # A collective fused into a kernel: its transfer, then the kernel's own work.
      totals.add(self._collective_of(instruction))
      _add_cost(totals, self.cost(instruction))
    else:
      _add_cost(totals, self.cost(instruction))

  def _started(self, start: Instruction) -> Totals:
    """The work an asynchronous start launches."""
    kind = collective_costs.kind_of(start.opcode)
    if kind:
      return self._collective(start, kind)
    if start.opcode == "send":
      return self._moved(collective_costs.megascale_transfer(self.module, start, self.network,
                                                             self.chip))
    if start.opcode == "fusion":
      return self._collective_of(start)
    totals = Totals()
    if start.opcode in _COPIES:
      _add_cost(totals, self._copy(start))
    elif start.opcode == "async-start" and self.module.called(start):
      called = self.module.called(start)
      totals.add(self._collective_of(start) if hlo_costs.fused_collectives(
          self.module, called) else self.computation(called))
    else:
      _add_cost(totals, self.cost(start))
    return totals

  def _collective_of(self, caller: Instruction) -> Totals:
    """The transfer of the collective inside a fusion or an async computation."""
    inner = hlo_costs.fused_collectives(self.module, self.module.called(caller))[0]
    return self._collective(inner, collective_costs.kind_of(inner.opcode))

  def _collective(self, instruction: Instruction, kind: str) -> Totals:
    return self._moved(collective_costs.transfer(self.module, instruction, kind,
                                                 self.network, self.chip))

  def _moved(self, moved: collective_costs.Transfer | None) -> Totals:
    totals = Totals()
    if moved is not None and moved.group_size > 1:
      totals.seconds["ici"] += moved.ici_seconds + (self.overhead if moved.ici_bytes else 0.0)
      totals.seconds["dcn"] += moved.dcn_seconds + (self.overhead if moved.dcn_bytes else 0.0)
      totals.ici_bytes, totals.dcn_bytes = moved.ici_bytes, moved.dcn_bytes
      totals.kernels, totals.unknown_dcn = 1, not moved.dcn_known
    return totals

  def _copy(self, start: Instruction) -> Cost:
    """An asynchronous copy or slice between HBM and vector memory."""
    if len(start.shape) < 2:
      return hlo_costs.FREE_COST
    if start.opcode == "slice-start":  # (operand, slice, context): the slice is read.
      result = start.shape[-2]
      read = result.bytes * (start.shape[0].memory_space == 0)
      written = hlo_costs.hbm([result])
    else:  # (destination, source, context)
      read, written = hlo_costs.hbm(start.shape[1:2]), hlo_costs.hbm(start.shape[:1])
    moved = read + written
    seconds = self.chip.hbm_seconds(read, written)
    return Cost(seconds, "memory", 0.0, moved, seconds)

  def cost(self, instruction: Instruction) -> Cost:
    """One synchronous kernel's cost."""
    opcode = instruction.opcode
    if opcode in hlo_costs.FREE or opcode.endswith(("-done", "-update")) or _scalar(instruction):
      return hlo_costs.FREE_COST
    matmul = None
    if opcode == "custom-call":
      target = instruction.attribute("custom_call_target") or ""
      if any(name in target for name in hlo_costs.FREE_CUSTOM_CALLS):
        return hlo_costs.FREE_COST
      matmul = hlo_costs.attention_flops(self.module, instruction, self.chip)
    elif opcode in ("dot", "convolution"):
      matmul = hlo_costs.matmul_seconds(self.module, instruction, self.chip)
    elif opcode == "fusion":
      found = [hlo_costs.matmul_seconds(self.module, m, self.chip)
               for m in hlo_costs.fused_matmuls(self.module, self.module.called(instruction))]
      matmul = (sum(f for f, _ in found), sum(s for _, s in found)) if found else None
    read, written = hlo_costs.instruction_bytes(self.module, instruction)
    moved = read + written
    memory_seconds = self.chip.hbm_seconds(read, written)
    flops, mxu_seconds = matmul or (0.0, 0.0)
    part = "compute" if mxu_seconds >= memory_seconds and matmul else "memory"
    return Cost(max(mxu_seconds, memory_seconds) + self.overhead, part, flops, moved,
                memory_seconds)


def _channel_key(collective: Instruction) -> tuple[str, str]:
  """What pairs the pieces of one asynchronous collective fusion: its collective's channel."""
  return ("channel", collective.attribute("channel_id") or collective.name)


def _async_channels(module: hlo_text.Module) -> frozenset:
  """The channel keys of the module's asynchronous collective fusions' starts."""
  return frozenset(
      _channel_key(inner[0]) for computation in module.computations.values()
      for instruction in computation.instructions
      if instruction.opcode == "fusion" and instruction.name.startswith("async-collective-start")
      and (inner := hlo_costs.fused_collectives(module, module.called(instruction))))


def _scalar(instruction: Instruction) -> bool:
  """Bookkeeping on the scalar unit: no array of more than one element in or out."""
  return instruction.opcode not in ("fusion", "custom-call") and all(
      a.elements <= 1 for a in instruction.shape)


def _add_cost(totals: Totals, cost: Cost) -> None:
  if cost.part == "free":
    return
  totals.seconds[cost.part] += cost.seconds
  totals.flops += cost.flops
  totals.hbm_bytes += cost.hbm_bytes
  totals.hbm_busy += cost.hbm_seconds
  totals.kernels += 1


def _overlap(totals: Totals, started: Totals, window: float) -> None:
  """Adds asynchronous work that ran beside `window` seconds of kernels: what exceeds the
  window is exposed, part by part in the order the work's parts are largest."""
  for part in sorted(PARTS, key=lambda p: -started.seconds[p]):
    exposed = max(0.0, started.seconds[part] - window)
    window = max(0.0, window - started.seconds[part])
    totals.seconds[part] += exposed
    totals.hidden[part] += started.seconds[part] - exposed
  for name in _COUNTS:
    setattr(totals, name, getattr(totals, name) + getattr(started, name))
  totals.unknown_dcn |= started.unknown_dcn


def bubble_seconds(pipelined: float, stages: int, microbatches: int, repeats: int = 1,
                   in_program: bool = True) -> float:
  """The pipeline bubble of a loop whose counted time is `pipelined` seconds: with the bubble
  iterations in the program, the share (p - 1) / (r m + p - 1) of it; without them, the idle
  time (p - 1) / (r m) of it added. 0 for one stage."""
  if stages <= 1:
    return 0.0
  if in_program:
    return pipelined * (stages - 1) / (repeats * microbatches + stages - 1)
  return pipelined * (stages - 1) / (repeats * microbatches)


def estimate(hlo: str, chip: chips.Chip, devices: Sequence[Any]) -> Totals:
  """The step's time by part, from its optimized HLO text, for `devices` in the program's
  order (the mesh's, flattened); no pipeline bubble (`summary` takes the pipeline)."""
  module = hlo_text.parse(hlo)
  partitions = re.search(r"num_partitions=(\d+)", hlo[:hlo.find("\n")])
  network = collective_costs.Network.of(devices, int(partitions.group(1)) if partitions
                                        else None)
  totals = Totals()
  totals.add(_Walker(module, chip, network).computation(module.entry))
  return totals


def kernel_times(hlo: str, chip: chips.Chip, devices: Sequence[Any]) -> dict[str, Cost]:
  """Each kernel's own cost by instruction name, times the trips of the loops around it
  (asynchronous transfers and collectives left out): for setting beside a profile."""
  module = hlo_text.parse(hlo)
  walker = _Walker(module, chip, collective_costs.Network.of(devices))
  found: dict[str, Cost] = {}

  def walk(name: str, times: float) -> None:
    for instruction in module.computations[name].instructions:
      if instruction.opcode == "while":
        trips = hlo_text.trip_count(module, instruction) or 1
        body = (instruction.attribute("body") or "").lstrip("%")
        if body in module.computations:
          walk(body, times * trips)
      elif instruction.opcode in ("call", "conditional"):
        for called in instruction.called():
          if called in module.computations:
            walk(called, times)
      elif not instruction.opcode.endswith(("-start", "-done")):
        cost = walker.cost(instruction)
        if cost.part != "free":
          found[instruction.name] = dataclasses.replace(
              cost, seconds=cost.seconds * times, flops=cost.flops * times,
              hbm_bytes=cost.hbm_bytes * times, hbm_seconds=cost.hbm_seconds * times)
  walk(module.entry, 1.0)
  return found


def as_dict(totals: Totals) -> dict[str, Any]:
  """What the compile keeps of an estimate (analyses.py), JSON-ready."""
  return {"version": MODEL_VERSION, "seconds": dict(totals.seconds),
          "hidden": dict(totals.hidden), "flops": totals.flops, "hbm_bytes": totals.hbm_bytes,
          "ici_bytes": totals.ici_bytes, "dcn_bytes": totals.dcn_bytes,
          "kernels": totals.kernels, "unknown_dcn": totals.unknown_dcn}


def pipelined(kept: dict[str, Any], stages: int = 1, microbatches: int = 1,
              repeats: int = 1) -> dict[str, float]:
  """A kept estimate's parts with a pipeline of `stages` x `microbatches` (x `repeats`)
  taken into account: the bubble's share of the compute and memory time moved into
  "bubble" (the SPMD pipeline's loop computes its bubble iterations)."""
  parts = {part: float(kept["seconds"].get(part, 0.0)) for part in PARTS}
  bubble = bubble_seconds(sum(parts.values()), stages, microbatches, repeats)
  busy = parts["compute"] + parts["memory"]
  if bubble and busy:
    moved = min(bubble, busy)
    for part in ("compute", "memory"):
      parts[part] -= moved * parts[part] / busy
    parts["bubble"] += moved
  return parts
