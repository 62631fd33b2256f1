"""Which mesh axes a logical axis splits a dimension over, for code placed per shard
(`jax.shard_map`: models/moe_parallel.py, models/embedding_lookup.py)."""

from __future__ import annotations

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec


def split_over(logical: str, size: int, mesh: jax.sharding.AbstractMesh) -> tuple[str, ...]:
  """The mesh axes (of more than one device) a dimension of `size` along the logical axis is
  split over under the active rules, or () where they do not divide it (one row, as shapes
  are traced with)."""
  mapped = nn.logical_to_mesh_axes((logical,))[0]
  names = (mapped,) if isinstance(mapped, str) else tuple(mapped or ())
  names = tuple(name for name in names if mesh.shape[name] > 1)
  return names if size % ways(names, mesh) == 0 else ()


def ways(names: tuple[str, ...], mesh: jax.sharding.AbstractMesh) -> int:
  """How many devices the mesh axes `names` span together."""
  count = 1
  for name in names:
    count *= mesh.shape[name]
  return count


def spec(*dims: tuple[str, ...]) -> PartitionSpec:
  """A partition spec of each dimension's mesh axes (() for none)."""
  return PartitionSpec(*(dim if dim else None for dim in dims))
