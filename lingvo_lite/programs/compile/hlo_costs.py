"""What one instruction of an optimized HLO module costs on a chip: the terms of the
step-time estimate (programs/compile/step_estimate.py walks the schedule and adds them).

  matmuls      dot and convolution instructions, alone or inside a fusion, and the attention
               kernels (Pallas splash/flash custom calls): their FLOPs as XLA counts them
               (`HloCostAnalysis`: 2 x multiply-adds, a convolution's padding and dilation
               holes skipped) at the chip's matmul rate, divided by the MXU's tile efficiency:
               the contraction and the output width are padded up to the systolic array's
               edge (128 on v4/v5e/v5p, 256 on v6e) and the streamed rows to the 8 sublanes,
               so a 64-wide head projection runs at half the rate. int8 operands run at the
               chip's int8 rate, float32 ones at XLA's precision config (HIGHEST: 6 passes,
               HIGH: 3). An attention kernel has no FLOP count in the HLO: it is counted from
               its query and key shapes as causal attention (the blocks on and below the
               diagonal, at the kernel's block size from its metadata), 2 matmuls forward and
               5 for the fused backward (4 for dK/dV alone, 3 for dQ alone), each with the head
               width as contraction or output.
  memory       every other kernel (fusions, copies, reductions, gathers, scatters, dynamic
               slices and updates): the bytes it reads and writes in HBM at the chip's
               bandwidth. Arrays in XLA:TPU's vector memory (`S(1)`) cost no HBM traffic; a
               fusion's operand read only through a (dynamic) slice costs the slice, and an
               in-place dynamic update costs the update, not the buffer (as HloCostAnalysis
               counts them). A matmul is the larger of its compute and its memory time.
  collectives  all-reduce, all-gather, reduce-scatter, all-to-all and collective-permute:
               the bytes the algorithm moves per device (ring all-reduce 2(n-1)/n of the
               array, all-gather and reduce-scatter (n-1)/n of the gathered array, all-to-all
               (n-1)/n, a permute the array) over the links the group crosses: within a slice
               2 ICI links per torus axis its devices span (a bidirectional ring each), across
               slices the chip's share of its host's DCN bandwidth; a group spanning slices
               runs hierarchically (its slice-local part over ICI, then across slices on
               1/m of the bytes, m devices per slice).
  every kernel adds the chip's fixed per-kernel overhead; scalar bookkeeping, parameters,
  tuples and bitcasts cost nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Sequence

from lingvo_lite import chips
from lingvo_lite.programs.compile import hlo_text
from lingvo_lite.programs.compile.hlo_text import Array, Instruction

# Instructions that emit no kernel: layout, tuple and control plumbing.
FREE = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
    "add-dependency", "opt-barrier", "partition-id", "replica-id", "domain", "iota", "send",
    "recv", "send-done", "recv-done"})
# Custom calls that move no data (XLA:TPU's own markers and buffer plumbing).
FREE_CUSTOM_CALLS = ("AllocateBuffer", "ConcatBitcast", "AssumeGatherIndicesInBound",
                      "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
               "collective-permute", "collective-broadcast")
_SLICING = ("dynamic-slice", "slice", "gather")
_PASSES = {"highest": 6, "high": 3}
_ATTENTION = re.compile(r"splash|flash|mha|attention", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Cost:
  """One instruction's time and where it goes.

  Attributes:
    seconds: Its time on the chip, the per-kernel overhead included.
    part: "compute" (MXU-bound), "memory" (HBM-bound), "ici", "dcn", or "free".
    flops: The matmul FLOPs it does (as counted, before tile padding).
    hbm_bytes: The HBM bytes it reads and writes.
    hbm_seconds: The time those bytes take (HBM is busy that long).
  """

  seconds: float
  part: str
  flops: float = 0.0
  hbm_bytes: float = 0.0
  hbm_seconds: float = 0.0


FREE_COST = Cost(0.0, "free")


def hbm(arrays: Sequence[Array]) -> float:
  """Stored bytes of the arrays that live in HBM (memory space 0)."""
  return sum(a.bytes for a in arrays if a.memory_space == 0)


def tile_efficiency(size: int, edge: int) -> float:
  """The fraction of `edge`-wide tiles a dimension of `size` fills."""
  return size / (-(-size // edge) * edge) if size > 0 else 1.0


def dot_flops(module: hlo_text.Module, dot: Instruction) -> tuple[float, int, int, int]:
  """(FLOPs, contraction K, output width N, rows M) of a dot."""
  lhs, rhs = (module.instructions[name].shape[0] for name in dot.operands[:2])
  contracting = _dims(dot.attribute("lhs_contracting_dims"))
  rhs_contracting = _dims(dot.attribute("rhs_contracting_dims"))
  rhs_batch = _dims(dot.attribute("rhs_batch_dims"))
  lhs_batch = _dims(dot.attribute("lhs_batch_dims"))
  k = math.prod(lhs.dims[d] for d in contracting)
  n = math.prod(size for d, size in enumerate(rhs.dims)
                if d not in rhs_contracting and d not in rhs_batch)
  m = math.prod(size for d, size in enumerate(lhs.dims)
                if d not in contracting and d not in lhs_batch)
  return 2.0 * dot.shape[0].elements * k, k, n, m


def _dims(value: str | None) -> list[int]:
  return [int(d) for d in (value or "{}").strip("{}").split(",") if d.strip()]


def _window(value: str | None, spatial: int) -> list[dict[str, Any]]:
  """A convolution's window, one dict per spatial dimension."""
  fields = dict(part.split("=", 1) for part in (value or "{}").strip("{}").split())
  dims = []
  for index in range(spatial):
    def field(key: str, default: str, i: int = index) -> str:
      return fields[key].split("x")[i] if key in fields else default
    low, high = field("pad", "0_0").split("_")
    dims.append({"stride": int(field("stride", "1")), "lhs": int(field("lhs_dilate", "1")),
                 "rhs": int(field("rhs_dilate", "1")), "low": int(low), "high": int(high)})
  return dims


def _valid_positions(size_in: int, size_kernel: int, size_out: int,
                     window: dict[str, Any]) -> int:
  """Pairs of (output position, kernel position) that meet a real input element."""
  count = 0
  for k in range(size_kernel):
    for o in range(size_out):
      undilated = o * window["stride"] - window["low"] + k * window["rhs"]
      if undilated % window["lhs"] == 0 and 0 <= undilated // window["lhs"] < size_in:
        count += 1
  return count


def convolution_flops(module: hlo_text.Module,
                      conv: Instruction) -> tuple[float, int, int, int]:
  """(FLOPs, contraction K, output width N, rows M) of a convolution, as HloCostAnalysis
  counts its FLOPs; K is the multiply-adds per output element, N the output features."""
  lhs, rhs = (module.instructions[name].shape[0] for name in conv.operands[:2])
  out = conv.shape[0]
  labels = conv.attribute("dim_labels") or "bf_io->bf"
  lhs_labels, rhs_labels = labels.split("->")[0].split("_")
  out_labels = labels.split("->")[1]
  spatial = len(lhs_labels) - 2
  valid = 1
  for index, window in enumerate(_window(conv.attribute("window"), spatial)):
    digit = str(index)
    valid *= _valid_positions(lhs.dims[lhs_labels.index(digit)],
                              rhs.dims[rhs_labels.index(digit)],
                              out.dims[out_labels.index(digit)], window)
  features = lhs.dims[lhs_labels.index("f")] // int(conv.attribute("feature_group_count") or 1)
  batch = lhs.dims[lhs_labels.index("b")] // int(conv.attribute("batch_group_count") or 1)
  n = out.dims[out_labels.index("f")]
  fmas = features * n * batch * valid
  k = max(1, round(fmas / max(out.elements, 1)))
  return 2.0 * fmas, k, n, max(1, out.elements // max(n, 1))


def _passes(module: hlo_text.Module, matmul: Instruction, chip: chips.Chip) -> float:
  """The matmul's time relative to a bf16 one: int8 faster, float32 by its precision."""
  operands = [module.instructions[name].shape[0].dtype for name in matmul.operands[:2]]
  if all(d in ("s8", "u8", "s4", "u4") for d in operands):
    return 1.0 / chip.int8_speedup
  precision = (matmul.attribute("operand_precision") or "").lower()
  if "f32" in operands or "f64" in operands:
    return float(max((p for name, p in _PASSES.items() if name in precision), default=1))
  return 1.0


def matmul_seconds(module: hlo_text.Module, matmul: Instruction,
                   chip: chips.Chip) -> tuple[float, float]:
  """(FLOPs, MXU seconds) of one dot or convolution, tile padding included; (0, 0) for one
  whose operands or dimension labels the text does not give."""
  count = dot_flops if matmul.opcode == "dot" else convolution_flops
  try:
    flops, k, n, m = count(module, matmul)
  except (KeyError, ValueError, IndexError):
    return 0.0, 0.0
  efficiency = (tile_efficiency(k, chip.mxu_edge) * tile_efficiency(n, chip.mxu_edge)
                * tile_efficiency(m, 8))
  if not flops:
    return 0.0, 0.0
  return flops, flops / efficiency * _passes(module, matmul, chip) / chip.matmul_flops.value


def _instructions(module: hlo_text.Module, computation: str | None) -> list[Instruction]:
  held = module.computations.get(computation) if computation else None
  return held.instructions if held is not None else []


def fused_matmuls(module: hlo_text.Module, computation: str | None) -> list[Instruction]:
  """The dots and convolutions of a fused computation, nested fusions' included."""
  found = []
  for instruction in _instructions(module, computation):
    if instruction.opcode in ("dot", "convolution"):
      found.append(instruction)
    elif instruction.opcode == "fusion":
      for called in instruction.called():
        found += fused_matmuls(module, called)
  return found


def fused_collectives(module: hlo_text.Module,
                      computation: str | None) -> list[Instruction]:
  """The collectives inside a fused (or async-wrapped) computation, nested fusions' too."""
  found = []
  for instruction in _instructions(module, computation):
    if instruction.opcode in COLLECTIVES:
      found.append(instruction)
    elif instruction.opcode == "fusion":
      for called in instruction.called():
        found += fused_collectives(module, called)
  return found


def _parameters(module: hlo_text.Module, computation: str) -> dict[int, str]:
  return {int(number.group()): p.name for p in _instructions(module, computation)
          if p.opcode == "parameter" and (number := re.match(r"\s*\d+", p.literal))}


def _parameter_reads(module: hlo_text.Module, computation: str, name: str,
                     full: Sequence[Array], depth: int = 0) -> float:
  """HBM bytes a fused parameter (or a bitcast of it) is read for: the slices taken of it
  where every use slices it (in nested fusions too), nothing where it is only the buffer an
  update writes into, else all of it."""
  uses = module.users(computation).get(name, [])
  if not uses or depth > 8 or not hbm(full):
    return hbm(full)
  total = 0.0
  for use in uses:
    if use.opcode in _SLICING and use.operands[0] == name:
      total += sum(a.bytes for a in use.shape)
    elif use.opcode == "dynamic-update-slice" and use.operands[0] == name:
      continue
    elif use.opcode in ("bitcast", "reshape"):
      total += _parameter_reads(module, computation, use.name, full, depth + 1)
    elif use.opcode == "fusion":
      nested = module.called(use)
      parameters = _parameters(module, nested)
      if not parameters:
        return hbm(full)
      total += sum(_parameter_reads(module, nested, parameters[index], full, depth + 1)
                   if index in parameters else hbm(full)
                   for index, operand in enumerate(use.operands) if operand == name)
    else:
      return hbm(full)
  return min(total, hbm(full))


def fusion_bytes(module: hlo_text.Module, fusion: Instruction) -> tuple[float, float]:
  """(HBM bytes read, HBM bytes written) by a fusion."""
  called = module.called(fusion)
  if called is None:  # Not a fusion this module prints: all it touches.
    return (sum(hbm(module.instructions[name].shape) for name in fusion.operands
                if name in module.instructions), hbm(fusion.shape))
  parameters = _parameters(module, called)
  read = written = 0.0
  for index, operand in enumerate(fusion.operands):
    arrays = module.instructions[operand].shape if operand in module.instructions else []
    read += (_parameter_reads(module, called, parameters[index], arrays)
             if index in parameters else hbm(arrays))
  root = module.computations[called].root
  outputs = ([module.instructions.get(name) for name in root.operands]
             if root.opcode == "tuple" else [root])
  for output, array in zip(outputs, fusion.shape):
    if array.memory_space != 0:
      continue
    if output is not None and output.opcode == "dynamic-update-slice":
      written += sum(a.bytes for a in module.instructions[output.operands[1]].shape)
    else:
      written += array.bytes
  return read, written


def instruction_bytes(module: hlo_text.Module, instruction: Instruction) -> tuple[float, float]:
  """(HBM bytes read, HBM bytes written) by an unfused kernel."""
  if instruction.opcode == "fusion":
    return fusion_bytes(module, instruction)
  operands = [module.instructions[name].shape for name in instruction.operands
              if name in module.instructions]
  written = hbm(instruction.shape)
  if instruction.opcode in _SLICING:
    return written + sum(hbm(a) for a in operands[1:]), written
  if instruction.opcode in ("dynamic-update-slice", "scatter") and len(operands) > 1:
    update = hbm(operands[-1]) if instruction.opcode == "scatter" else hbm(operands[1])
    return update + sum(hbm(a) for a in operands[2:]), update
  return sum(hbm(a) for a in operands), written


def kernel_metadata(instruction: Instruction) -> dict[str, Any]:
  """A Pallas kernel's metadata (its block sizes), or {}."""
  match = re.search(r'"xprof_metadata":"(\{.*?\})"', instruction.attributes, re.DOTALL)
  if not match:
    return {}
  try:
    return json.loads(match.group(1).replace('\\"', '"'))
  except ValueError:
    return {}


def attention_flops(module: hlo_text.Module, kernel: Instruction,
                    chip: chips.Chip) -> tuple[float, float] | None:
  """(FLOPs, MXU seconds) of an attention kernel's custom call, None if it is no attention
  kernel this can read (a query of [batch, heads, length, width] and keys beside it)."""
  op_name = re.search(r'op_name="([^"]*)"', kernel.attributes)
  label = kernel.name + " " + (op_name.group(1) if op_name else "")
  if not _ATTENTION.search(label):
    return None
  arrays = [module.instructions[name].shape[0] for name in kernel.operands
            if name in module.instructions and module.instructions[name].shape]
  # Queries, keys and values: [batch, heads, length, width] in the compute dtype (float32
  # 4-D operands beside bf16 ones are the backward's saved softmax statistics).
  heads = [a for a in arrays if len(a.dims) == 4 and a.dtype in ("bf16", "f16", "f32")]
  if any(a.dtype != "f32" for a in heads):
    heads = [a for a in heads if a.dtype != "f32"]
  if len(heads) < 2:
    return None
  query = max(heads, key=lambda a: a.dims[1])
  keys = min((a for a in heads if a.dims[3] == query.dims[3]), key=lambda a: a.dims[1])
  batch, count, length, width = query.dims
  key_length = keys.dims[2]
  meta = kernel_metadata(kernel)
  block_q = int(meta.get("block_q") or length)
  block_k = int(meta.get("block_kv") or key_length)
  matmuls = 2
  if "dkv" in label:
    matmuls = 5 if meta.get("use_fused_bwd_kernel") else 4
  elif "dq" in label:
    matmuls = 3
  flops = 2.0 * matmuls * batch * count * length * key_length * width
  flops *= _causal_fraction(length, key_length, block_q, block_k)
  return flops, flops / tile_efficiency(width, chip.mxu_edge) / chip.matmul_flops.value


def _causal_fraction(length: int, key_length: int, block_q: int, block_k: int) -> float:
  """The fraction of (query block, key block) pairs on or below the causal diagonal."""
  rows, columns = -(-length // block_q), -(-key_length // block_k)
  kept = sum(min(columns, -(-((i + 1) * block_q) // block_k)) for i in range(rows))
  return kept / (rows * columns)
