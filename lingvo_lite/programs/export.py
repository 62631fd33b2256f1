"""The export program: a job's checkpoint out of lingvo_lite, as a Hugging Face folder.

  --mode=export --job_log_dir=JOB --export_format=hf --export_dir=out/JOB_hf
  --mode=export --job_log_dir=JOB --export_format=hf --export_dir=... --export_dtype=bfloat16
  --mode=export --job_log_dir=JOB ... --checkpoint_step=N        (default: the newest usable)

The job's config (its config.json, or --exp with its flags) is the model's; only the
parameters are restored (checkpoints/params.py): the job's own checkpoint, or, for a job that
has none yet, the weight source its config starts from (weights/job_params.py). The folder
(weights/hf_export.py: config.json, safetensors, an index above 5 GB a shard) is written
beside its final place and renamed into it whole, over an earlier export of lingvo_lite's
only, never over anything else (lingvo_lite/outputs.py). A model the format cannot express
is refused in one line before anything is read.

Host memory: the restored parameters are read as NumPy arrays (on a CPU, views of the
device buffers; on an accelerator, one host copy), and each output tensor is made from them as
it is written: a Hugging Face folder holds one shard (`--export_shard_bytes`, 5 GB by default)
beside them, a GGUF file one tensor.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np
from etils import epath

from lingvo_lite import file_writes, outputs, paths
from lingvo_lite.checkpoints import selection as checkpoint_selection
from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.config import files as config_files
from lingvo_lite.data import vocabulary_tokenizer
from lingvo_lite.data.source import text_vocabulary
from lingvo_lite.errors import UsageError, os_error_text, shown
from lingvo_lite.models import layer_layout
from lingvo_lite.programs import (Invocation, ProgramFailure, record_config_where_missing,
                                 refuse_model_changes)
from lingvo_lite.programs.options import checkpoint_step_option, init_from_option, option
from lingvo_lite.runtime.job_dirs import FILE, JobFiles
from lingvo_lite.weights import gguf_export, hf_export, job_params, slim_weights, sources

FORMATS = ("hf", "gguf", "slim")


@dataclasses.dataclass(frozen=True)
class Options:
  """The flags of --mode=export."""

  checkpoint_step: int | None = checkpoint_step_option()
  init_from: str | None = init_from_option()
  export_format: str = option(
      "hf", f"--mode=export: the format written: {', '.join(FORMATS)} (a Hugging Face folder "
      "that transformers' from_pretrained loads; a GGUF file, model.gguf, for llama.cpp and "
      "transformers; slim weights: the parameters alone, orbax, which --init_from=slim:PATH "
      "reads).")
  export_dir: str | None = option(
      None, "--mode=export: the folder the export goes to (required); an earlier export "
      "lingvo_lite wrote there is replaced, anything else is never overwritten.",
      non_empty=True)
  export_dtype: str | None = option(
      None, f"--mode=export: the dtype of every tensor written: hf "
      f"{', '.join(hf_export.DTYPES)}; gguf {', '.join(gguf_export.DTYPES)}; slim "
      f"{', '.join(slim_weights.DTYPES)} (int8: the weight matrices as int8 values with a "
      "float32 scale per output channel) (default: the model's param_dtype).", non_empty=True)
  export_shard_bytes: int = option(
      hf_export.MAX_SHARD_BYTES, "--mode=export --export_format=hf: the largest safetensors "
      "file; more bytes are split into shards listed by model.safetensors.index.json.")


  def config_parts(self, cfg: Any) -> dict[str, Any]:
    """`train.init_from` (and a source's `model`) from --init_from (weights/sources.py): a
    job dir without a checkpoint of its own exports the source's parameters."""
    return sources.config_parts(self.init_from, cfg)


# A job dir made by export (a source's model, no checkpoint yet) records the config it ran
# with, so that later programs can name just the job dir; a job's config is never rewritten.
JOB_FILES = JobFiles(creates=True, written=((config_files.CONFIG_JSON, FILE),
                                            (config_files.CONFIG_TXT, FILE)))


def _check_options(options: Options, param_dtype: str) -> str:
  """The dtype to write. Raises UsageError for a flag that cannot work."""
  if options.export_format not in FORMATS:
    raise UsageError(f"--export_format={options.export_format}: unknown format; valid "
                     f"choices: {', '.join(FORMATS)}")
  if options.export_dir is None:
    raise UsageError("--export_dir: required for --mode=export; e.g. --export_dir=out/my_hf")
  dtype = options.export_dtype or param_dtype
  dtypes = {"gguf": gguf_export.DTYPES, "hf": hf_export.DTYPES,
            "slim": slim_weights.DTYPES}[options.export_format]
  if dtype not in dtypes:
    flag = "--export_dtype" if options.export_dtype else "model.param_dtype"
    raise UsageError(f"{flag}={dtype}: not a dtype the {options.export_format} export writes; "
                     f"valid choices: {', '.join(dtypes)}")
  if options.export_shard_bytes < 1:
    raise UsageError(f"--export_shard_bytes={options.export_shard_bytes}: must be at least 1 "
                     "(bytes per safetensors file)")
  return dtype


def main(invocation: Invocation) -> None:
  options: Options = invocation.options
  setup = invocation.setup
  model = setup.model
  refuse_model_changes(invocation, "export")
  dtype = _check_options(options, model.param_dtype)
  checkpoint_selection.check_wanted(options.checkpoint_step)
  shown_job = epath.Path(invocation.shown_job_dir or invocation.job_dir)
  if options.export_format == "slim":
    _export_slim(invocation, options, dtype, shown_job)
    return
  config = hf_export.check_expressible(model)
  is_gguf = options.export_format == "gguf"
  if is_gguf:
    gguf_export.check_expressible(model, config)
  unrolled = model.clone(parent=None, scan_layers=False)
  shapes = {"/".join(str(k.key) for k in path): tuple(leaf.shape) for path, leaf in
            jax.tree_util.tree_flatten_with_path(MeshParams(
                unrolled, setup.train_data.sequence_length, setup.partitioner,
                setup.partitioner.make_mesh(invocation.target.devices)).abstract)[0]}
  tokenizer, no_tokenizer = _tokenizer(setup)
  plan = hf_export.plan_shards(unrolled.hf_tensors(), shapes, dtype, options.export_shard_bytes,
                               tokenizer)
  # Checked before the checkpoint is read: an earlier export of lingvo_lite's (its files
  # only) is replaced, anything else refused.
  flag = f"--export_dir={shown(options.export_dir)}"
  kind, names = ((gguf_export.KIND, (gguf_export.FILE,)) if is_gguf else
                 (hf_export.KIND, plan.names))
  output = outputs.check_folder(paths.resolve(options.export_dir, "--export_dir"), flag,
                                kind, names + (outputs.MANIFEST,), "the export",
                                invocation.job_dir)
  mesh = setup.partitioner.make_mesh(invocation.target.devices)
  params, what, step = job_params.restore(
      setup, MeshParams(model, setup.train_data.sequence_length, setup.partitioner, mesh),
      invocation.job_dir, shown_job, options.checkpoint_step)
  host = jax.tree.map(np.asarray, jax.device_get(params))
  del params
  if model.scan_layers:
    host = layer_layout.unstack_layers(host)
  host = unrolled.hf_export_params(host)
  checkpoint_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(host))
  written: dict[str, Any] = {}

  def write(folder: epath.Path) -> None:
    if is_gguf:
      written.update(gguf_export.write(os.fspath(folder / gguf_export.FILE), unrolled,
                                       hf_export.NamedTensors(unrolled, host), dtype, config,
                                       tokenizer))
    else:
      written.update(hf_export.write(folder, unrolled, host, dtype, plan, config))
    _write_manifest(folder, kind, shown_job, step, what, options.export_format, dtype, written)

  replaced = _write_folder(output, write, flag, options.export_dir)
  # Only once the export is written: a failed one (a source that cannot be read, a full disk)
  # leaves a new job dir unmade.
  record_config_where_missing(invocation)
  total = sum(written["files"].values())
  files = (f"{gguf_export.FILE} ({written['architecture']}"
           f"{', with its tokenizer' if written['tokenizer'] else ''})" if is_gguf else
           f"{len(plan.files)} safetensors file(s)")
  print(f"exported {what} to {options.export_dir} "
        f"({'replaced the earlier export' if replaced else 'new'}): {options.export_format}, "
        f"{dtype}, {written['tensors']} tensors in {files}, "
        f"{_size(total)} (the parameters read: {_size(checkpoint_bytes)} "
        f"{model.param_dtype})", flush=True)
  for name in names:
    print(f"  {os.path.join(options.export_dir, name)}  {_size(written['files'][name])}")
  if no_tokenizer:
    print(f"  no tokenizer files: {no_tokenizer}")
  elif is_gguf and not written["tokenizer"]:
    print(f"  no tokenizer in {gguf_export.FILE}: its tokenizer.ggml.* keys are written for a "
          "pretrained byte-level BPE tokenizer only (this model's tokenizer is "
          f"{tokenizer.source})")


def _tokenizer(setup: Any) -> tuple[Any, str]:
  """The tokenizer files the export carries (the task vocabulary's: a pretrained tokenizer's
  own, or bytes and SentencePiece converted, data/vocabulary_tokenizer.py), or None and why
  there are none."""
  try:
    return vocabulary_tokenizer.tokenizer_files(text_vocabulary(setup.train_data)), ""
  except vocabulary_tokenizer.NotConvertible as e:
    return None, str(e)


def _export_slim(invocation: Invocation, options: Options, dtype: str,
                 shown_job: epath.Path) -> None:
  """The parameters alone, in `dtype`, as an orbax checkpoint with the job's config."""
  setup = invocation.setup
  model = setup.model
  flag = f"--export_dir={shown(options.export_dir)}"
  output = outputs.check_folder(paths.resolve(options.export_dir, "--export_dir"), flag,
                                slim_weights.KIND, slim_weights.FILES + (outputs.MANIFEST,),
                                "the export", invocation.job_dir)
  mesh = setup.partitioner.make_mesh(invocation.target.devices)
  params, what, step = job_params.restore(
      setup, MeshParams(model, setup.train_data.sequence_length, setup.partitioner, mesh),
      invocation.job_dir, shown_job, options.checkpoint_step)
  read_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
  step_bytes = _folder_bytes(invocation.job_dir / "checkpoints" / str(step)) if (
      step is not None) else None
  written: dict[str, Any] = {}

  def write(folder: epath.Path) -> None:
    written.update(slim_weights.write(folder, params, dtype, invocation.config_json(), model))
    _write_manifest(folder, slim_weights.KIND, shown_job, step, what, "slim", dtype, written)

  replaced = _write_folder(output, write, flag, options.export_dir)
  # Only once the export is written: a failed one (a source that cannot be read, a full disk)
  # leaves a new job dir unmade.
  record_config_where_missing(invocation)
  before = (f"the checkpoint step: {_size(step_bytes)} on disk, its parameters "
            f"{_size(read_bytes)} {model.param_dtype}" if step_bytes is not None else
            f"the parameters read: {_size(read_bytes)} {model.param_dtype}")
  print(f"exported {what} to {options.export_dir} "
        f"({'replaced the earlier export' if replaced else 'new'}): slim, {dtype}, "
        f"{_size(sum(written['files'].values()))} ({before}); read it with "
        f"--init_from=slim:{options.export_dir}", flush=True)


def _write_manifest(folder: epath.Path, kind: str, shown_job: epath.Path, step: int | None,
                    what: str, export_format: str, dtype: str, written: dict[str, Any]) -> None:
  manifest = {"schema": outputs.schema(kind), "job_log_dir": str(shown_job), "step": step,
              "parameters": what, "format": export_format, "dtype": dtype, **written}
  with file_writes.writing(folder / outputs.MANIFEST):
    (folder / outputs.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _write_folder(output: Any, write: Any, flag: str, export_dir: str) -> bool:
  """outputs.write_folder, a failed write one line naming the file (nothing is left there)."""
  try:
    return outputs.write_folder(output, write)
  except OSError as e:
    problem, fix = os_error_text(e, "export again")
    raise ProgramFailure(f"{flag}: cannot write {_failed_file(e, output.path, export_dir)}: "
                         f"{problem}; nothing was left there; {fix}") from None


def _failed_file(error: OSError, folder: epath.Path, export_dir: str) -> str:
  """The file a failed write names, under --export_dir as the user wrote it; `the export`
  where it names none."""
  name, root = error.filename, os.fspath(folder)
  if isinstance(name, str) and (name == root or name.startswith(root + os.sep)):
    return os.path.normpath(os.path.join(export_dir, os.path.relpath(name, root)))
  return "the export"


def _folder_bytes(folder: epath.Path) -> int:
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(os.fspath(folder)) for name in names)


def _size(count: int) -> str:
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
    if count >= scale:
      return f"{count / scale:.1f} {unit}"
  return f"{count} bytes"
