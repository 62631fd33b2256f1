"""An optimized HLO module's text (`compiled.as_text()`) read into data: its computations, each
instruction's shape (with XLA:TPU's tiles and memory spaces), operands and attributes.

What the step-time estimate (programs/compile/step_estimate.py) reads of the program XLA will
run: names are unique across a module, so one table maps every instruction name to its
instruction. The order of a computation's instructions is the printed one, which for a
scheduled module (every compiled one) is the order they run in.

Shapes: `bf16[4,2048,2048]{1,2,0:T(8,128)(2,1)S(1)}` is a bfloat16 array whose dimensions run
1, 2, 0 from minor to major, stored in tiles of 8 x 128 elements (the two most minor
dimensions padded to them), in memory space 1 (S(1): XLA:TPU's on-chip vector memory; no S:
HBM). A tuple shape is its leaves.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Iterator

import numpy as np

# Bytes per element of each element type (4-bit types rounded up: XLA packs two a byte).
DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
                "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "bf16": 2, "f16": 2,
                "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8,
                "c64": 8, "c128": 16, "token": 0}
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](\{[^{}]*\})?")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*")
_HEADER = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s*[({]")
_CALLED = re.compile(r"\b(calls|to_apply|body|condition|branch_computations)=\{?([^,}\s]+"
                     r"(?:,\s*%[\w.\-]+)*)\}?")


@dataclasses.dataclass(frozen=True)
class Array:
  """One array of a shape.

  Attributes:
    dtype: XLA's element type (`bf16`).
    dims: The dimension sizes.
    minor_to_major: The layout, or None where the text gives none.
    tile: The first tile's sizes (`(8, 128)`), or None.
    memory_space: 0 for HBM (no `S(n)`), else n (1: XLA:TPU's vector memory).
  """

  dtype: str
  dims: tuple[int, ...]
  minor_to_major: tuple[int, ...] | None = None
  tile: tuple[int, ...] | None = None
  memory_space: int = 0

  @property
  def elements(self) -> int:
    return math.prod(self.dims)

  @property
  def logical_bytes(self) -> float:
    """Bytes of the elements themselves, no tile padding."""
    return self.elements * DTYPE_BYTES.get(self.dtype, 4)

  @property
  def bytes(self) -> float:
    """Bytes as stored: the tiled dimensions padded up to the tile."""
    dims = list(self.dims)
    if self.tile and self.minor_to_major and dims:
      for tile_size, dim in zip(reversed(self.tile), self.minor_to_major):
        dims[dim] = -(-dims[dim] // tile_size) * tile_size
    return math.prod(dims) * DTYPE_BYTES.get(self.dtype, 4)


@dataclasses.dataclass
class Instruction:
  """One HLO instruction.

  Attributes:
    name: Its name, without the `%`.
    opcode: `fusion`, `convolution`, `all-reduce-start`, ...
    shape: The leaves of its shape, in order.
    operands: Its operands' names.
    attributes: The text after the operand list (`kind=kLoop, calls=%f, ...`).
    computation: The name of the computation it belongs to.
    root: Whether it is that computation's root.
    literal: The text between the parentheses (a constant's value).
  """

  name: str
  opcode: str
  shape: list[Array]
  operands: list[str]
  attributes: str
  computation: str = ""
  root: bool = False
  literal: str = ""

  def attribute(self, key: str) -> str | None:
    """The value of `key=...` (a `{...}` value whole, braces balanced), or None."""
    match = re.search(r"(?:^|[\s,])" + re.escape(key) + r"=", self.attributes)
    if not match:
      return None
    start = match.end()
    if start < len(self.attributes) and self.attributes[start] == "{":
      return self.attributes[start:_closing(self.attributes, start, "{", "}") + 1]
    end = re.search(r",\s|$", self.attributes[start:])
    return self.attributes[start:start + end.start()].strip()

  def called(self) -> list[str]:
    """The computations it calls (a fusion's, a loop's body and condition, a reduction's)."""
    names = []
    for _, value in _CALLED.findall(self.attributes):
      names += [name.strip().lstrip("%") for name in value.split(",")]
    return names


@dataclasses.dataclass
class Computation:
  name: str
  entry: bool
  instructions: list[Instruction]

  @property
  def root(self) -> Instruction:
    return next((i for i in self.instructions if i.root), self.instructions[-1])


@dataclasses.dataclass
class Module:
  """A module: its computations by name, the entry's name, every instruction by name."""

  computations: dict[str, Computation]
  entry: str
  instructions: dict[str, Instruction]

  _users: dict[str, dict[str, list[Instruction]]] = dataclasses.field(default_factory=dict)

  def called(self, instruction: Instruction) -> str | None:
    """The first computation `instruction` calls that the module holds, or None."""
    return next((name for name in instruction.called() if name in self.computations), None)

  def users(self, computation: str) -> dict[str, list[Instruction]]:
    """Each instruction of `computation`'s users within it."""
    if computation not in self._users:
      found: dict[str, list[Instruction]] = {}
      for instruction in self.computations[computation].instructions:
        for operand in instruction.operands:
          found.setdefault(operand, []).append(instruction)
      self._users[computation] = found
    return self._users[computation]


def _closing(text: str, start: int, opening: str, closing: str) -> int:
  """The index of the bracket closing the one at `start`."""
  depth = 0
  for index in range(start, len(text)):
    if text[index] == opening:
      depth += 1
    elif text[index] == closing:
      depth -= 1
      if depth == 0:
        return index
  return len(text) - 1


def parse_array(match: re.Match) -> Array:
  """An `Array` of a `_ARRAY` match."""
  dtype, dims_text, layout = match.groups()
  # A bounded dynamic dimension prints as `<=8`: its bound is what a buffer holds.
  dims = tuple(int(found.group()) if (found := re.search(r"\d+", d)) else 0
               for d in dims_text.split(",") if d.strip())
  minor_to_major = tile = None
  memory_space = 0
  if layout:
    body = layout[1:-1]
    order, _, rest = body.partition(":")
    if order.strip():
      minor_to_major = tuple(int(d) for d in order.split(","))
    tiled = re.search(r"T\(([\d,]+)\)", rest)
    tile = tuple(int(t) for t in tiled.group(1).split(",")) if tiled else None
    space = re.search(r"S\((\d+)\)", rest)
    memory_space = int(space.group(1)) if space else 0
  return Array(dtype, dims, minor_to_major, tile, memory_space)


def parse_shape(text: str) -> tuple[list[Array], int]:
  """(the leaves of the shape at the start of `text`, where it ends)."""
  if text.startswith("("):
    end = _closing(text, 0, "(", ")")
    return [parse_array(m) for m in _ARRAY.finditer(text[:end + 1])], end + 1
  match = _ARRAY.match(text)
  if not match:
    return [], 0
  return [parse_array(match)], match.end()


def _instruction(text: str, computation: str) -> Instruction | None:
  head = _INSTRUCTION.match(text)
  if not head:
    return None
  rest = text[head.end():]
  shape, end = parse_shape(rest)
  opcode = re.match(r"\s*([\w\-]+)\(", rest[end:])
  if not opcode:
    return None
  start = end + opcode.end() - 1
  close = _closing(rest, start, "(", ")")
  operands = re.findall(r"%([\w.\-]+)", rest[start:close + 1])
  return Instruction(head.group(2), opcode.group(1), shape, operands, rest[close + 1:],
                     computation, bool(head.group(1)), rest[start + 1:close])


def _statements(text: str) -> Iterator[tuple[str, str]]:
  """("header" | "instruction" | "end", text) per statement; an instruction printed over
  several lines (a kernel's metadata holds newlines) is joined into one."""
  pending = None
  for line in text.splitlines():
    # A computation ends at a line of its own "}" (a kernel's metadata, printed over several
    # lines, has lines that start with "}}" and continue its instruction).
    ends = line.rstrip() == "}"
    starts = (_HEADER.match(line) and not line[0].isspace()) or _INSTRUCTION.match(line) \
        or ends or line.startswith("HloModule")
    if starts and pending is not None:
      yield "instruction", pending
      pending = None
    if ends:
      yield "end", line
    elif not line[:1].isspace() and _HEADER.match(line):
      yield "header", line
    elif _INSTRUCTION.match(line):
      pending = line
    elif pending is not None:
      pending += "\n" + line
  if pending is not None:
    yield "instruction", pending


def parse(text: str) -> Module:
  """The module printed in `text` (`compiled.as_text()`)."""
  computations: dict[str, Computation] = {}
  instructions: dict[str, Instruction] = {}
  entry, current = "", None
  for kind, statement in _statements(text):
    if kind == "header":
      header = _HEADER.match(statement)
      current = Computation(header.group(2), bool(header.group(1)), [])
      computations[current.name] = current
      entry = current.name if current.entry else entry
    elif kind == "end":
      current = None
    elif current is not None:
      instruction = _instruction(statement, current.name)
      if instruction is not None:
        current.instructions.append(instruction)
        instructions[instruction.name] = instruction
  if not entry and computations:
    entry = list(computations)[-1]  # XLA prints the entry last.
  return Module(computations, entry, instructions)


def replica_groups(instruction: Instruction) -> list[list[int]] | None:
  """A collective's groups of devices: `{{0,1},{2,3}}`; the iota form `[2,2]<=[4]` (the
  iota over the device count, reshaped, optionally transposed `T(1,0)`, read as rows); or
  the mesh form `mesh['axis_0'=2,'axis_1'=4] {'axis_1'}` (the devices of a mesh in iota
  order, a group per position of the axes not named). None where the instruction names none
  or a form this does not read (then all devices form one group)."""
  value = instruction.attribute("replica_groups")
  if value is None:
    match = re.search(r"replica_groups=(\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)",
                      instruction.attributes)
    value = match.group(1) if match else None
  if value is None or value in ("{}", "{{}}"):
    return None
  if value.startswith("{"):
    groups = [[int(d) for d in group.split(",") if d.strip()]
              for group in re.findall(r"\{([\d,\s]*)\}", value[1:-1])]
    return [g for g in groups if g] or None
  if value.startswith("mesh"):
    return _mesh_groups(value)
  iota = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", value)
  if not iota:
    return None
  shape, reshape, transpose = iota.groups()
  dims = [int(d) for d in reshape.split(",")]
  ids = np.arange(math.prod(dims)).reshape(dims)
  if transpose:
    ids = ids.transpose([int(d) for d in transpose.split(",")])
  rows = [int(d) for d in shape.split(",")]
  return ids.reshape(rows[0], -1).tolist()


def _mesh_groups(value: str) -> list[list[int]] | None:
  match = re.fullmatch(r"mesh\[([^\]]*)\]\s*\{([^}]*)\}", value.strip())
  if not match:
    return None
  axes = re.findall(r"'([^']+)'=(\d+)", match.group(1))
  names = [name for name, _ in axes]
  grouped = [names.index(n) for n in re.findall(r"'([^']+)'", match.group(2)) if n in names]
  ids = np.arange(math.prod(int(size) for _, size in axes)).reshape(
      [int(size) for _, size in axes])
  kept = [axis for axis in range(len(axes)) if axis not in grouped]
  size = math.prod(int(axes[axis][1]) for axis in grouped)
  return ids.transpose(kept + grouped).reshape(-1, size).tolist()


def source_target_pairs(instruction: Instruction) -> list[tuple[int, int]]:
  """A collective-permute's (source, target) device pairs."""
  value = instruction.attribute("source_target_pairs") or ""
  return [(int(a), int(b)) for a, b in re.findall(r"\{(\d+),\s*(\d+)\}", value)]


def trip_count(module: Module, loop: Instruction) -> int | None:
  """How many times a while loop runs: XLA's `known_trip_count` where the backend config
  states it, else read from the loop's bounds (a condition comparing the counter with a
  constant, the counter starting from a constant, the body adding a constant step to it: XLA
  unrolls a loop by stepping its counter by 2); None if neither."""
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"', loop.attributes)
  if known:
    return int(known.group(1))
  condition = module.computations.get((loop.attribute("condition") or "").lstrip("%"))
  if condition is None:
    return None
  compare = condition.root
  direction = re.search(r"direction=(\w+)", compare.attributes)
  if compare.opcode != "compare" or not direction or len(compare.operands) != 2:
    return None
  counter, bound = (module.instructions.get(name) for name in compare.operands)
  if counter is None or bound is None or counter.opcode != "get-tuple-element":
    return None
  limit = _constant(module, bound)
  index = int(counter.attribute("index") or 0)
  start = _start_value(module, loop, index)
  step = _step(module, loop, index)
  if limit is None or start is None or not step:
    return None
  span = {"LT": limit - start, "LE": limit - start + 1, "GT": start - limit,
          "GE": start - limit + 1, "NE": abs(limit - start)}.get(direction.group(1))
  return max(-(-span // abs(step)), 0) if span is not None else None


def _step(module: Module, loop: Instruction, index: int) -> int | None:
  """What the loop's body adds to tuple element `index` each trip (1 where it is not an
  addition of a constant)."""
  body = module.computations.get((loop.attribute("body") or "").lstrip("%"))
  if body is None or body.root.opcode != "tuple" or index >= len(body.root.operands):
    return 1
  update = module.instructions.get(body.root.operands[index])
  if update is None or update.opcode not in ("add", "subtract"):
    return 1
  for name in update.operands:
    operand = module.instructions.get(name)
    value = None if operand is None else _constant(module, operand)
    if value is not None:
      return value if update.opcode == "add" else -value
  return 1


def _constant(module: Module, instruction: Instruction, depth: int = 0) -> int | None:
  """An integer scalar constant's value, through copies and bitcasts."""
  if instruction.opcode == "constant":
    value = re.fullmatch(r"\s*(-?\d+)\s*", instruction.literal)
    return int(value.group(1)) if value else None
  if instruction.opcode in ("copy", "bitcast", "convert") and depth < 8 and \
      instruction.operands:
    operand = module.instructions.get(instruction.operands[0])
    return None if operand is None else _constant(module, operand, depth + 1)
  return None


def _start_value(module: Module, loop: Instruction, index: int) -> int | None:
  """The loop counter's first value: element `index` of the loop's initial tuple."""
  init = module.instructions.get(loop.operands[0]) if loop.operands else None
  if init is None or init.opcode != "tuple" or index >= len(init.operands):
    return None
  element = module.instructions.get(init.operands[index])
  return None if element is None else _constant(module, element)
