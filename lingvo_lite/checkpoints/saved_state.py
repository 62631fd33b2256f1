"""What a restore checks of a saved state besides its files' checksums: that its tree fits the
config's, and that its step counter is the step its folder is named for.

Both are read from what orbax gives back cheaply: the tree's paths and shapes from the step's
metadata (no array read), the step counter from the restored state, or, where the state is not
restored whole, from a partial restore of that one scalar (`counter_placeholder`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

STEP = "step"  # The TrainState field that counts the steps trained; orbax keys it so.


def on_disk(state: Any) -> Any:
  """The tree orbax writes and reads for `state`: a dataclass state's fields that hold
  something, as a dict (a TrainState's `frozen` parameters are loaded at every start, never
  saved: None there); any other tree as it is. A dict, not the dataclass: orbax compares a
  dataclass's fields with the saved tree's, so a field a checkpoint does not hold would make it
  refuse every checkpoint written before the field was added; a dict of the same keys reads
  them, as it reads the ones written as dicts."""
  if dataclasses.is_dataclass(state) and not isinstance(state, type):
    return {field.name: getattr(state, field.name) for field in dataclasses.fields(state)
            if getattr(state, field.name) is not None}
  return state


def from_disk(restored: Any, like: Any) -> Any:
  """A tree `on_disk(like)` restored, as `like`'s type again (its unsaved fields as in
  `like`)."""
  if isinstance(restored, dict) and dataclasses.is_dataclass(like):
    return like.replace(**restored)
  return restored


def _by_path(tree: Any, value: Any) -> dict[str, Any]:
  """'params/layers_0/attention/query/kernel' -> value(leaf), for any pytree of arrays or
  metadata (a TrainState's attributes and a restored dict's keys name a leaf alike)."""
  found = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    names = [str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))
             for key in path]
    found["/".join(names)] = value(leaf)
  return found


def shapes_by_path(tree: Any) -> dict[str, tuple[int, ...]]:
  """Each leaf's shape by its path (`_by_path`)."""
  return _by_path(tree, lambda leaf: tuple(getattr(leaf, "shape", ())))


def dtypes_by_path(tree: Any) -> dict[str, str | None]:
  """Each leaf's dtype name by its path (None where it has none)."""
  return _by_path(tree, lambda leaf: None if getattr(leaf, "dtype", None) is None
                  else np.dtype(leaf.dtype).name)


def misfit(saved_metadata: Any, abstract_state: Any, subtree: str | None = None,
           dtypes: bool = False) -> str | None:
  """How the saved tree differs from `abstract_state` (the first path missing, of another
  shape, or extra; with `dtypes`, of another dtype), or None. With `subtree`, only the saved
  arrays under that top-level key are compared. orbax would otherwise fail deep inside
  tensorstore, or silently broadcast, truncate or cast (float32 Adam moments read as
  bfloat16 ones, or back)."""
  saved = shapes_by_path(saved_metadata)
  if subtree is not None:
    saved = {path: shape for path, shape in saved.items()
             if path == subtree or path.startswith(f"{subtree}/")}
  wanted = shapes_by_path(abstract_state)
  for path, shape in wanted.items():
    if path not in saved:
      return f"it has no {path} (this config's state has one of shape {shape})"
    if saved[path] != shape:
      return f"its {path} has shape {saved[path]}, this config's has {shape}"
  extra = [path for path in saved if path not in wanted]
  if extra:
    return f"it holds {extra[0]}, which this config's state has no place for"
  if dtypes:
    saved_dtypes = dtypes_by_path(saved_metadata)
    for path, dtype in dtypes_by_path(abstract_state).items():
      if None not in (dtype, saved_dtypes.get(path)) and saved_dtypes[path] != dtype:
        return f"its {path} is {saved_dtypes[path]}, this config's is {dtype}"
  return None


def entry(tree: Any, name: str) -> Any:
  """The top-level entry `name` of a restored state or its metadata (a TrainState's field, or
  a key of a dict or of orbax's tree metadata), or None."""
  get = getattr(tree, "get", None)
  return get(name) if callable(get) else getattr(tree, name, None)


def counter_placeholder(saved_metadata: Any) -> dict[str, np.ndarray]:
  """{'step': a host array of the saved counter's shape and dtype}: what a partial restore
  of the counter alone asks for (one scalar is read); {} where the saved tree has none."""
  counter = entry(saved_metadata, STEP)
  if counter is None:
    return {}
  return {STEP: np.zeros(tuple(counter.shape), np.dtype(counter.dtype))}


def counter(restored: Any) -> int | None:
  """The step counter of a restored state (a host array, or a device array replicated on
  every device: any one local copy will do), or None where it has none."""
  value = entry(restored, STEP)
  if value is None:
    return None
  if isinstance(value, jax.Array):
    value = value.addressable_data(0)
  value = np.asarray(value)
  return int(value) if value.shape == () and np.issubdtype(value.dtype, np.integer) else None


def counter_problem(step: int, value: int | None) -> str | None:
  """Why a state whose counter is `value` is not step `step` (None: it is, or has no counter):
  its folder was copied or renamed from another step's."""
  if value is None or value == step:
    return None
  return (f"its state's step counter is {value} (the folder is a copy or a rename of step "
          f"{value}'s)")


def partial_restore(item_dir: epath.Path, wanted: dict[str, Any], alone: bool = False
                    ) -> dict[str, Any]:
  """The top-level entries `wanted` names of the state saved in `item_dir` (a step's item
  folder), nothing else read.

  orbax's StandardCheckpointHandler has no partial restore (orbax 0.12 refuses PLACEHOLDER
  leaves in it), so the PyTree handler it wraps reads the item folder directly;
  `partial_restore` trims the saved tree to `wanted` before anything is read. `alone`: by
  this process alone, without the barrier orbax's Checkpointer ends a restore with (which
  every process must reach). Raises what orbax raises reading a damaged step.
  """
  handler = ocp.PyTreeCheckpointHandler()
  reader = handler if alone else ocp.Checkpointer(handler)
  args = ocp.args.PyTreeRestore(
      item=wanted, restore_args=ocp.checkpoint_utils.construct_restore_args(wanted),
      partial_restore=True)
  with contextlib.closing(reader):
    return reader.restore(item_dir, args=args)


def read_counter(item_dir: epath.Path, saved_metadata: Any) -> int | None:
  """The step counter saved in `item_dir`, read alone (one scalar, not the state), by this
  process alone; None where the saved tree has none. Raises what orbax raises reading a
  damaged step."""
  placeholder = counter_placeholder(saved_metadata)
  return counter(partial_restore(item_dir, placeholder, alone=True)) if placeholder else None
