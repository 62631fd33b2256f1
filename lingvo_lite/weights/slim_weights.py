"""Slim weights: a job's parameters alone (no optimizer state), optionally in bfloat16, as an
orbax checkpoint that `--init_from=slim:PATH` reads back onto any mesh (what mesh-transformer-jax
users made of GPT-J-6B's 61 GB training checkpoint for inference: 9 GB of bfloat16 weights).

The folder (written by `--mode=export --export_format=slim`):
  params/         the parameter tree, orbax (tensorstore), in the model's own layer layout
  config.json     the job's config, so `--fdl_config_file=PATH/config.json` rebuilds its model
  manifest.json   what was written (outputs.py's manifest: the kind, the dtype, the sizes)

Written in int8 (`--export_dtype=int8`), every weight matrix is its int8 values and a float32
scale per output channel (models/quantization.py's `stored_int8`: a quarter of the float32
bytes), the other parameters (norms, biases) in float32.

Read back, each parameter is restored straight into this model's shardings and cast to its
`param_dtype` (int8 weights as their values times their scales); a model of other shapes or
another layer layout is refused in one line.

The whole format is this module and its row in weights/formats.py: `SlimCheckpoint` (the
source `--init_from=slim:PATH` sets) and `SlimExport` (the writer of `--export_format=slim`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
from etils import epath

from lingvo_lite import file_writes, input_files, outputs, paths
from lingvo_lite.checkpoints import orbax_errors as checkpoint_errors
from lingvo_lite.errors import UsageError
from lingvo_lite.models import quantization
from lingvo_lite.models.layer_layout import flatten, unflatten
from lingvo_lite.weights import tensor_checks
from lingvo_lite.weights.exports import size_text
from lingvo_lite.weights.weight_source import PathSource

KIND = "slim_export"
PARAMS_DIR, CONFIG_FILE = "params", "config.json"
FILES = (PARAMS_DIR, CONFIG_FILE)
FIELD = "train.init_from"
_FOLDER_FIX = "give a folder --mode=export --export_format=slim wrote"
_CONFIG_FIX = "use the config it was exported with (--fdl_config_file=PATH/config.json)"
DTYPES = ("float32", "bfloat16", "int8")


def write(folder: epath.Path, params: Any, dtype: str, config_json: str,
          model: Any) -> dict[str, Any]:
  """Writes `params` (cast to `dtype`; "int8": the weight matrices of `model`, its family,
  quantized) and the config into the empty `folder`.

  Returns:
    {"files": name -> bytes, "scan_layers": the layout} for the manifest.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  if dtype == "int8":
    cast = jax.jit(lambda p: quantization.stored_int8(
        jax.tree.map(lambda leaf: leaf.astype(jnp.float32), p),
        model.parameter_logical_specs(), model.int8_weight_contractions()))(params)
  else:
    cast = jax.tree.map(lambda leaf: leaf.astype(jnp.dtype(dtype)), params)
  checkpoint_errors.silence_closed_loop_errors()
  checkpointer = ocp.StandardCheckpointer()
  try:
    checkpointer.save(os.fspath(folder / PARAMS_DIR), cast)
    checkpointer.wait_until_finished()
  except checkpoint_errors.READ_ERRORS as e:
    # tensorstore reports a failed write (a full disk) as a ValueError quoting its errno: an
    # OSError of that errno, naming the folder, is what a failed export says.
    number = checkpoint_errors.errno_of(e)
    if number is None:
      raise
    raise OSError(number, os.strerror(number), os.fspath(folder / PARAMS_DIR)) from e
  finally:
    checkpointer.close()
  with file_writes.writing(folder / CONFIG_FILE):
    (folder / CONFIG_FILE).write_text(config_json)
  sizes = {CONFIG_FILE: os.path.getsize(os.fspath(folder / CONFIG_FILE)),
           PARAMS_DIR: sum(os.path.getsize(os.path.join(root, name))
                           for root, _, names in os.walk(os.fspath(folder / PARAMS_DIR))
                           for name in names)}
  return {"files": sizes, "scan_layers": bool(model.scan_layers)}


@dataclasses.dataclass(frozen=True)
class SlimCheckpoint(PathSource):
  """Parameters from a slim-weights folder (`--mode=export --export_format=slim`).

  Attributes:
    path: The folder (relative to the working directory).
  """

  scheme = "slim"
  holds = "a slim-weights folder"

  def _manifest(self) -> tuple[epath.Path, dict[str, Any]]:
    folder = paths.resolve(self.path, f"{FIELD}.path")
    manifest = folder / "manifest.json"
    try:
      data = input_files.json_value(input_files.read_bytes(
          manifest, f"{FIELD}=slim:{self.path}: its manifest.json", _FOLDER_FIX))
      schema = data["schema"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
      raise UsageError(f"{FIELD}=slim:{self.path}: not a slim-weights folder (no readable "
                       "manifest.json); give a folder --mode=export --export_format=slim "
                       "wrote") from None
    if schema != outputs.schema(KIND):
      raise UsageError(f"{FIELD}=slim:{self.path}: its manifest.json is {schema!r}, not "
                       f"{outputs.schema(KIND)!r} (slim weights)")
    return folder, data

  def load_params(self, mesh_params: Any) -> tuple[Any, str]:
    """The parameters, in `mesh_params`' shardings and dtypes.

    Raises:
      UsageError: not a slim folder, another layer layout, shapes this model does not have,
        or files that cannot be read.
    """
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    folder, manifest = self._manifest()
    model = mesh_params.model
    if bool(manifest.get("scan_layers")) != bool(model.scan_layers):
      raise UsageError(f"{FIELD}=slim:{self.path}: written with model.scan_layers="
                       f"{manifest.get('scan_layers')}, and this model has "
                       f"{model.scan_layers}; set --fdl.model.scan_layers to match")
    saved_dtype = manifest.get("dtype", "float32")
    if saved_dtype == "int8":
      target = quantization.stored_int8_shapes(
          jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, jnp.float32,
                                                         sharding=leaf.sharding),
                       mesh_params.abstract),
          model.parameter_logical_specs(), model.int8_weight_contractions())
    else:
      target = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(
          leaf.shape, jnp.dtype(saved_dtype), sharding=leaf.sharding), mesh_params.abstract)
    # orbax opens the folder's files by names of its own, and would wait on a FIFO for ever.
    input_files.check_folder(folder, f"{FIELD}=slim:{self.path}", _FOLDER_FIX)
    checkpointer = ocp.StandardCheckpointer()
    try:
      unread = self._check_saved(checkpointer, folder, target)
      # orbax restores the whole tree: what nothing reads comes along, and is dropped.
      saved = checkpointer.restore(os.fspath(folder / PARAMS_DIR),
                                   unflatten({**flatten(target), **unread}))
    except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
      raise UsageError(f"{FIELD}=slim:{self.path}: its parameters do not fit this model "
                       f"({str(e).splitlines()[0][:200] if str(e) else type(e).__name__}); "
                       f"{_CONFIG_FIX}") from None
    except Exception as e:  # pylint: disable=broad-except
      # orbax wraps tensorstore's failure to read an array (a truncated or unreadable data
      # file) in a bare Exception; its cause says what the file system said.
      if not checkpoint_errors.caused_by(e, checkpoint_errors.READ_ERRORS):
        raise
      raise UsageError(f"{FIELD}=slim:{self.path}: its parameters cannot be read "
                       f"({checkpoint_errors.innermost_cause(e)}); the folder is truncated or "
                       "damaged: copy or export it again") from None
    finally:
      checkpointer.close()
    saved = unflatten({path: leaf for path, leaf in flatten(saved).items() if path not in unread})
    if saved_dtype == "int8":
      shardings = jax.tree.map(lambda leaf: leaf.sharding, mesh_params.abstract)
      saved = jax.jit(quantization.read_stored_int8, out_shardings=shardings)(saved)
    params = jax.tree.map(lambda leaf, want: leaf.astype(want.dtype), saved,
                          mesh_params.abstract)
    return params, f"slim:{self.path} ({manifest.get('dtype')}, step {manifest.get('step')})"

  def _check_saved(self, checkpointer: Any, folder: epath.Path, target: Any) -> dict[str, Any]:
    """Checks what the folder holds against `target` (the tree to restore, as shapes) by the
    rules of every weight source (tensor_checks.py): each parameter there, a float where the
    model reads floats (int8 values where it reads int8), of the model's shape; what no part
    of the model reads is named in one warning, and returned (path -> its shape and dtype).

    Raises:
      UsageError: one line naming the folder, the parameter and the fix.
    """
    where = f"{FIELD}=slim:{self.path}"
    metadata = checkpointer.metadata(os.fspath(folder / PARAMS_DIR))
    held = flatten(getattr(getattr(metadata, "item_metadata", metadata), "tree", metadata))
    wanted = flatten(target)
    for path, want in wanted.items():
      if path not in held:
        raise tensor_checks.missing(where, path, _CONFIG_FIX)
      have = held[path]
      reads = [f"{path} {list(want.shape)}"]
      tensor_checks.check_dtype(where, path, have.dtype, reads, [want.dtype])
      tensor_checks.check_shape(where, path, have.shape, want.shape, reads, _CONFIG_FIX)
    unread = sorted(set(held) - set(wanted))
    tensor_checks.warn_unread(where, unread)
    return {path: jax.ShapeDtypeStruct(held[path].shape, held[path].dtype) for path in unread}


class SlimExport:
  """`--export_format=slim`: the parameters alone, in the request's dtype, with the job's
  config (formats.Export)."""

  kind = KIND
  dtypes = DTYPES
  dtype_note = (" (int8: the weight matrices as int8 values with a float32 scale per output "
                "channel)")
  names = FILES

  def __init__(self, request: Any):
    self._request = request
    self._params: Any = None
    self._read_bytes = 0
    self._step_bytes: int | None = None

  def take(self, params: Any) -> None:
    self._params = params
    self._read_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
    opened = self._request.params
    if opened.step is not None:
      step_dir = opened.job_dir / "checkpoints" / str(opened.step)
      self._step_bytes = sum(os.path.getsize(os.path.join(root, name))
                             for root, _, names in os.walk(os.fspath(step_dir))
                             for name in names)

  def write(self, folder: epath.Path) -> dict[str, Any]:
    request = self._request
    return write(folder, self._params, request.dtype, request.config_json(),
                 request.setup.model)

  def summary(self, written: dict[str, Any]) -> str:
    param_dtype = self._request.setup.model.param_dtype
    before = (f"the checkpoint step: {size_text(self._step_bytes)} on disk, its parameters "
              f"{size_text(self._read_bytes)} {param_dtype}" if self._step_bytes is not None
              else f"the parameters read: {size_text(self._read_bytes)} {param_dtype}")
    return (f"{size_text(sum(written['files'].values()))} ({before}); read it with "
            f"--init_from=slim:{self._request.export_dir}")

  def details(self, written: dict[str, Any]) -> list[str]:
    del written
    return []
