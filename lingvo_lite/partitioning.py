"""Device mesh and logical-axis sharding rules.

The model names the axes of its parameters and activations logically (`embed`, `mlp`,
`heads`, `experts`, ...); the partitioner maps those names onto named mesh axes (`data`,
`fsdp`, `expert`, `tensor`) and turns an abstract state tree into NamedShardings. Pure data
parallelism is the default: every parameter replicated, the batch split over all devices.
The `expert` axis splits a mixture of experts' stacked experts (expert parallelism,
models/moe_parallel.py) and, like every data-parallel axis, the batch. The `stage` axis splits
the scanned layer stack (its `layers` axis) into pipeline stages (models/pipeline.py); the
batch is not split over it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Iterable, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lingvo_lite.errors import config_error
from lingvo_lite.fields import PositiveInt, Range

IciSize = Annotated[int, Range(1, also=(-1,), note="-1 takes the devices left over")]

# Outer to inner: the pipeline's stages outermost (one collective-permute of activations per
# pipeline iteration, the cheapest traffic to send farthest), the tensor axis, whose
# collectives run every layer, innermost (nearest devices); the expert axis's all-gathers and
# reduce-scatters of activations next to it.
MESH_AXES = ("stage", "data", "fsdp", "expert", "tensor")
# The logical axes of the batch and of activations along it, whatever the model.
DATA_AXES = ("batch", "length")
# The residual stream between layers (the embeddings, each block's output, the scanned stack's
# carry that remat keeps per layer): its width has a name of its own, apart from `embed` (the
# weights' width, split over fsdp, which the batch already takes on an activation).
ACTIVATION_AXES = DATA_AXES + ("activation_embed",)
# The logical axis names the default rules map: the batch's and the residual stream's, and
# those the transformer families name their parameters' axes by. A model's own are its
# family's `logical_axes()`.
LOGICAL_AXES = ACTIVATION_AXES + ("embed", "mlp", "heads", "kv", "vocab", "norm", "position",
                                  "layers", "experts", "latent", "q_lora", "kv_lora")

# Logical axis -> mesh axes. The batch is split over every data-parallel axis (FSDP and the
# expert axis are data parallel for activations, as in MaxText); weights are split over fsdp on
# `embed` and over tensor on the head/MLP/vocab dimensions (Megatron-style), a mixture's
# stacked experts over expert.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp", "expert")),
    ("length", None),
    # The residual stream's width over tensor, as MaxText's `activation_embed` rule: each of a
    # tensor group's chips keeps 1/tensor of the layer inputs remat saves, where whole they
    # were 16 copies of the same rows (MaxText128B's scan kept 2 x 32 GiB a chip). XLA
    # all-gathers them before the projections that read them; the projections' sums are
    # all-reduced at the whole width and sliced back (models/block.py `_summand`: a
    # reduce-scatter straight onto tensor meets a partitioner bug).
    ("activation_embed", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("vocab", "tensor"),
    ("norm", None),
    ("position", None),
    ("layers", "stage"),
    ("experts", "expert"),
    # Latent attention's compressed width (models/latent_attention.py): small (512), shared
    # by every head, so kept whole like a head's features...
    ("latent", None),
    # ...except as the up projections' input: those matrices have no `embed`, and whole on
    # every chip they were 37 GiB of DeepSeek-V3's float32 state; FSDP splits them here.
    ("q_lora", "fsdp"),
    ("kv_lora", "fsdp"),
)


def _device_grid(sizes: tuple[int, ...], devices: Sequence[Any]) -> np.ndarray:
  """`devices` as an array of `sizes`, in the interconnect's order within each process.

  With several processes each one's devices form one block, the blocks in process order, so
  every process's devices hold the contiguous rows its data source reads (a torus-order
  mesh of a 64-host pod scatters a host's rows across the batch)."""
  if len(devices) == 1:
    return np.asarray(devices).reshape(sizes)
  per_process = _per_process_shape(sizes, devices)
  if per_process is None:
    return mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)
  if sum(size > 1 for size in sizes) > 1:
    blocks = _same_block_in_every_process(per_process, devices)
    if blocks is not None:
      outer = tuple(s // p for s, p in zip(sizes, per_process))
      # The blocks in process order over the outer grid, as jax's hybrid mesh lays them out.
      stacked = np.stack(blocks).reshape(outer + per_process)
      order = [axis for k in range(len(sizes)) for axis in (k, len(sizes) + k)]
      return stacked.transpose(order).reshape(sizes)
  return mesh_utils.create_hybrid_device_mesh(
      per_process, tuple(s // p for s, p in zip(sizes, per_process)), devices,
      process_is_granule=True, allow_split_physical_axes=True)


def _same_block_in_every_process(per_process: tuple[int, ...], devices: Sequence[Any]
                                 ) -> list[np.ndarray] | None:
  """Each process's devices as a `per_process` block, in process order, every block the
  first one's layout moved to its process's chips; None without chip coordinates or when
  the processes' chips differ in shape.

  jax's v5e mesh rings only the host whose chips include (0, 0) and leaves the others in
  coordinate order, so the groups of a mesh axis across processes would not be translates of
  one another, and XLA:TPU's routing on a large slice (v5e-32 and up) refuses their
  collectives ("Failed to create limited ICI routing replica info table"). With one split axis
  there is one group of every device, and jax's hybrid mesh is kept as it is.
  """
  if not all(hasattr(d, "coords") for d in devices):
    return None
  by_process: dict[int, list[Any]] = {}
  for device in devices:
    by_process.setdefault(device.process_index, []).append(device)

  def place(device: Any, origin: tuple[int, ...]) -> tuple[int, ...]:
    """Where `device` sits in its process's chips (and which core of its chip)."""
    return (*(c - o for c, o in zip(device.coords, origin)),
            getattr(device, "core_on_chip", 0))

  def at_places(group: list[Any]) -> dict[tuple[int, ...], Any]:
    origin = tuple(min(coords) for coords in zip(*(d.coords for d in group)))
    return {place(d, origin): d for d in group}

  groups = [by_process[index] for index in sorted(by_process)]
  first = at_places(groups[0])
  inverse = {d: spot for spot, d in first.items()}
  template = mesh_utils.create_device_mesh(per_process, groups[0],
                                           allow_split_physical_axes=True)
  blocks = []
  for group in groups:
    spots = at_places(group)
    if len(spots) != len(group) or spots.keys() != first.keys():
      return None
    block = np.empty(template.shape, dtype=object)
    for index, device in np.ndenumerate(template):
      block[index] = spots[inverse[device]]
    blocks.append(block)
  return blocks


def _per_process_shape(sizes: tuple[int, ...], devices: Sequence[Any]
                       ) -> tuple[int, ...] | None:
  """The block of `sizes` one process's devices fill, innermost axes first (the tensor axis
  stays within a host), or None for one process or when no such block exists."""
  processes = {d.process_index for d in devices}
  if len(processes) < 2 or len(devices) % len(processes):
    return None
  left = len(devices) // len(processes)
  block = [1] * len(sizes)
  for axis in reversed(range(len(sizes))):
    block[axis] = math.gcd(sizes[axis], left)
    left //= block[axis]
  return tuple(block) if left == 1 else None


def _as_tuple(target: Any) -> tuple[str, ...]:
  if target is None:
    return ()
  return (target,) if isinstance(target, str) else tuple(target)


@dataclasses.dataclass(frozen=True)
class Partitioner:
  """Mesh shape and sharding rules.

  Attributes:
    ici_stage, ici_data, ici_fsdp, ici_expert, ici_tensor: Mesh axis sizes within a slice; one
      may be -1 to take the devices left over. `expert` splits a mixture's experts (and the
      batch); `stage` the scanned layers into pipeline stages (models/pipeline.py: with
      `train.pipeline_microbatches` and `train.pipeline_repeats`).
    dcn_stage, dcn_data, dcn_fsdp, dcn_expert, dcn_tensor: Mesh axis sizes across slices
      (multi-slice jobs).
    rules: Logical axis name -> mesh axis (or tuple of axes, or None for replicated).
  """

  ici_data: IciSize = -1
  ici_fsdp: IciSize = 1
  ici_tensor: IciSize = 1
  ici_expert: IciSize = 1
  ici_stage: IciSize = 1
  dcn_data: PositiveInt = 1
  dcn_fsdp: PositiveInt = 1
  dcn_tensor: PositiveInt = 1
  dcn_expert: PositiveInt = 1
  dcn_stage: PositiveInt = 1
  rules: tuple[tuple[str, Any], ...] = DEFAULT_RULES

  @property
  def ici_shape(self) -> tuple[int, ...]:
    """Sizes within a slice, in `MESH_AXES`' order."""
    return (self.ici_stage, self.ici_data, self.ici_fsdp, self.ici_expert, self.ici_tensor)

  @property
  def dcn_shape(self) -> tuple[int, ...]:
    """Sizes across slices, in `MESH_AXES`' order."""
    return (self.dcn_stage, self.dcn_data, self.dcn_fsdp, self.dcn_expert, self.dcn_tensor)

  def without_stages(self) -> Partitioner:
    """This partitioner with the stage axis folded away: the same mesh, the stacked layers
    replicated over the `stage` axis instead of split (its devices then hold copies, as the
    data axis's do). What eval, decode, serve and export run a pipelined job's parameters
    with: they run no pipeline, and the batch's split is the one training checked."""
    if not self.pipelines():
      return self
    rules = tuple((name, None if name == "layers" else target) for name, target in self.rules)
    return dataclasses.replace(self, rules=rules)

  def pipelines(self) -> bool:
    """Whether the rules split the stacked layers over the `stage` axis (a pipeline)."""
    return "stage" in self.mesh_axes_of(("layers",))[0]

  def resolved_ici_shape(self, num_devices: int) -> tuple[int, ...]:
    """ICI sizes with a -1 replaced by the devices left over; raises if they don't fit."""
    per_slice = num_devices // math.prod(self.dcn_shape)
    sizes = list(self.ici_shape)
    if sizes.count(-1) > 1:
      raise config_error("partitioner.ici_*", tuple(sizes), "at most one mesh axis may be -1")
    if -1 in sizes:
      known = math.prod(s for s in sizes if s != -1)
      if known <= 0 or per_slice % known:
        raise config_error(
            "partitioner.ici_*", f"{tuple(sizes)} x dcn {self.dcn_shape}",
            f"the fixed axis sizes do not divide the {per_slice} devices per slice")
      sizes[sizes.index(-1)] = per_slice // known
    if math.prod(sizes) * math.prod(self.dcn_shape) != num_devices:
      raise config_error(
          "partitioner.ici_*", f"{tuple(sizes)} x dcn {self.dcn_shape}",
          f"the mesh has {math.prod(sizes) * math.prod(self.dcn_shape)} devices but "
          f"{num_devices} are available; make the product of the axis sizes {num_devices} "
          "or set one axis to -1")
    return tuple(sizes)

  def check_slices(self, num_slices: int, target_name: str, platform: str) -> None:
    """The axes across slices (over the data-center network) match a TPU target's slices.

    On CPUs and GPUs the dcn axes are outer mesh axes (across processes, in device order)."""
    across = math.prod(self.dcn_shape)
    if (num_slices > 1 or platform == "tpu") and across != num_slices:
      # The example completes the other axes with dcn_data where they divide the slices (a
      # set dcn_fsdp=2 over 4 slices needs dcn_data=2, not 4); else they all go back to 1.
      others = across // self.dcn_data
      example = (f"--fdl.partitioner.dcn_data={num_slices // others}" if num_slices % others == 0
                 else f"--fdl.partitioner.dcn_data={num_slices} and the other dcn_* axes 1")
      raise config_error(
          "partitioner.dcn_*", dict(zip(MESH_AXES, self.dcn_shape)),
          f"the mesh axes across slices multiply to {across}, but {target_name} has "
          f"{num_slices} slice{'s' if num_slices > 1 else ''}", f"make their product "
          f"{num_slices} (e.g. {example})")

  def mesh_axis_sizes(self, num_devices: int) -> dict[str, int]:
    """Size of each mesh axis (within-slice size x across-slice size)."""
    ici = self.resolved_ici_shape(num_devices)
    return {axis: i * d for axis, i, d in zip(MESH_AXES, ici, self.dcn_shape)}

  def check_rules(self, used_logical_axes: set[str],
                  model_axes: Iterable[str] | None = None) -> None:
    """Rules name known logical and mesh axes, and cover every logical axis in use.

    A rule's target is None (replicated), a mesh axis name, or a tuple of distinct mesh axis
    names: anything else fails inside Flax or JAX when the first array is sharded, with a
    traceback (an int is not iterable; `('fsdp', 'fsdp')` is a DuplicateSpecError).

    Args:
      used_logical_axes: The names the model's parameters and the batch use.
      model_axes: Every logical axis name the model's family knows (its `logical_axes()`),
        beside those of LOGICAL_AXES (the default rules').
    """
    # The default rules' names are known to every model (a dense model has no `experts` to
    # split, and its rule splits nothing); a family may name more.
    known = tuple(dict.fromkeys(LOGICAL_AXES + tuple(model_axes or ())))
    for name, target in self.rules:
      if name not in known:
        raise config_error("partitioner.rules", name, "unknown logical axis name",
                           f"valid names: {', '.join(known)}")
      example = f"e.g. ({name!r}, 'data'), ({name!r}, ('data', 'fsdp')) or ({name!r}, None)"
      if target is not None and not isinstance(target, str) and not (
          isinstance(target, (tuple, list)) and all(isinstance(a, str) for a in target)):
        raise config_error("partitioner.rules", (name, target),
                           "a rule maps a logical axis to None, a mesh axis name or a tuple "
                           "of mesh axis names", example)
      for axis in _as_tuple(target):
        if axis not in MESH_AXES:
          raise config_error("partitioner.rules", f"{name} -> {axis}", "unknown mesh axis",
                             f"valid mesh axes: {', '.join(MESH_AXES)} (or None)")
      if len(set(_as_tuple(target))) != len(_as_tuple(target)):
        raise config_error("partitioner.rules", (name, target),
                           "names a mesh axis twice; an array dimension is split over each "
                           "mesh axis at most once", "give each mesh axis once")
    missing = sorted(used_logical_axes - {name for name, _ in self.rules})
    if missing:
      raise config_error("partitioner.rules", missing, "no rule for these logical axes",
                         f"add ({missing[0]!r}, None) to replicate or map it to a mesh axis")
    self._check_activation_axes()

  def _check_activation_axes(self) -> None:
    """The residual stream's dimensions take distinct mesh axes.

    Flax gives a mesh axis to the first of an array's logical axes whose rule names it and
    leaves a later one whole: with `activation_embed` on a mesh axis the batch's rule names
    too, either the activations' width or their batch would silently stay unsplit (a
    replicated batch does every row's work on every chip). A logical axis with a second rule
    (a fallback Flax tries in order) is what the user asked for, and is let through.
    """
    shared = self.shared_mesh_axis(ACTIVATION_AXES)
    if shared is not None:
      first, name, axis = shared
      raise config_error(
          "partitioner.rules", f"{first} -> {axis}, {name} -> {axis}",
          f"the activations between layers, {list(ACTIVATION_AXES)}, have dimensions "
          f"{first!r} and {name!r}, and one mesh axis can split only one dimension of "
          "an array", f"map {name!r} to a mesh axis {first!r} does not use (the default "
          "is 'tensor') or to None")

  def shared_mesh_axis(self, logical_axes: Sequence[str | None]
                       ) -> tuple[str, str, str] | None:
    """(the first logical axis, a later one, the mesh axis both ask for) where two dimensions
    of one array are mapped to one mesh axis by their first rules, or None. A logical axis
    with a second rule (a fallback Flax tries in order) is what the user asked for, and is
    let through."""
    owner: dict[str, str] = {}
    for name in logical_axes:
      if not name:
        continue
      for axis in self.intended_mesh_axes(name):
        first = owner.setdefault(axis, name)
        if first != name and not self.has_fallback(name):
          return first, name, axis
    return None

  def intended_mesh_axes(self, logical_axis: str | None) -> tuple[str, ...]:
    """The mesh axes of the first rule for `logical_axis` (what the user asked for)."""
    for name, target in self.rules:
      if name == logical_axis:
        return _as_tuple(target)
    return ()

  def has_fallback(self, logical_axis: str) -> bool:
    """Whether more than one rule names `logical_axis` (Flax tries them in order)."""
    return sum(name == logical_axis for name, _ in self.rules) > 1

  def mesh_axes_of(self, logical_spec: Sequence[str | None]) -> list[tuple[str, ...]]:
    """Mesh axes each dimension of a logically named array is split over."""
    axes = nn.logical_to_mesh_axes(tuple(logical_spec), list(self.rules))
    return [_as_tuple(a) for a in axes]

  def make_mesh(self, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds the mesh with Auto axis types (Flax's logical constraints expect Auto)."""
    if devices is None:
      from lingvo_lite import target  # pylint: disable=g-import-not-at-top
      devices = target.current().devices
    devices = list(devices)
    ici = self.resolved_ici_shape(len(devices))
    if math.prod(self.dcn_shape) > 1 and len(
        {getattr(d, "slice_index", 0) for d in devices}) > 1:
      # TPU slices: the dcn axes run across slices, the ici axes within one. (CPU processes
      # may carry one slice_index for all: their dcn axes are outer axes across processes.)
      slices = sorted({d.slice_index for d in devices})
      grids = np.stack([_device_grid(ici, [d for d in devices if d.slice_index == index])
                        for index in slices]).reshape(*self.dcn_shape, *ici)
      # Slice-major within each axis: axis k of the mesh is (dcn_k, ici_k).
      order = [axis for k in range(len(ici)) for axis in (k, len(ici) + k)]
      device_array = grids.transpose(order).reshape(
          tuple(i * d for i, d in zip(ici, self.dcn_shape)))
    else:
      device_array = _device_grid(tuple(i * d for i, d in zip(ici, self.dcn_shape)), devices)
    return Mesh(device_array, MESH_AXES)

  def data_parallel_size(self, axis_sizes: dict[str, int]) -> int:
    """Number of ways the batch is split (the product of the mesh axes `batch` maps to)."""
    return math.prod(axis_sizes[axis] for axis in self.mesh_axes_of(("batch",))[0])

  def logical_to_sharding(self, logical_specs: Any, mesh: Mesh) -> Any:
    """Maps a tree of logical PartitionSpecs to NamedShardings.

    Mesh axes of size 1 are dropped from the specs: they split nothing, and a spec that
    names only real splits reads as what it is (P() on a data-parallel mesh: replicated).
    """
    def drop_unit_axes(sharding: NamedSharding) -> NamedSharding:
      dims = []
      for axes in sharding.spec:
        kept = tuple(a for a in _as_tuple(axes) if mesh.shape[a] > 1)
        dims.append(kept[0] if len(kept) == 1 else (kept or None))
      while dims and dims[-1] is None:
        dims.pop()
      return NamedSharding(mesh, PartitionSpec(*dims))
    shardings = nn.logical_to_mesh_sharding(logical_specs, mesh, list(self.rules))
    return jax.tree.map(drop_unit_axes, shardings,
                        is_leaf=lambda x: isinstance(x, NamedSharding))

  def batch_sharding(self, mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a [batch, length, ...] input array (the same mapping as parameters)."""
    return self.logical_to_sharding(PartitionSpec("batch", *(None,) * (ndim - 1)), mesh)
