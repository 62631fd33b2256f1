"""The export program: a job's parameters out of lingvo_lite, in a weight format of the table.

  --mode=export --job_log_dir=JOB --export_format=hf --export_dir=out/JOB_hf
  --mode=export --job_log_dir=JOB --export_format=hf --export_dir=... --export_dtype=bfloat16
  --mode=export --job_log_dir=JOB ... --checkpoint_step=N        (default: the newest usable)

The job's config (its config.json, or --exp with its flags) is the model's; only the
parameters are restored (weights/job_params.py): the job's own checkpoint, or, for a job that
has none yet, the weight source its config starts from. `--export_format` names a row of
weights/formats.py, whose writer checks the model first (a model the format cannot express is
refused in one line before anything is read), says which files the folder gets, and writes
them. The folder is written beside its final place and renamed into it whole, over an earlier
export of lingvo_lite's only, never over anything else (lingvo_lite/outputs.py), with a
manifest of what was written.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from etils import epath

from lingvo_lite import file_writes, output_folders, outputs, paths
from lingvo_lite.config import files as config_files
from lingvo_lite.errors import UsageError, os_error_text, shown
from lingvo_lite.programs import (Invocation, ProgramFailure, record_config_where_missing,
                                 refuse_model_changes)
from lingvo_lite.programs.options import checkpoint_step_option, init_from_option, option
from lingvo_lite.runtime.job_dirs import FILE, JobFiles
from lingvo_lite.weights import formats, hf_export, sources
from lingvo_lite.weights.exports import ExportRequest
from lingvo_lite.weights.job_params import JobParams

# The formats written, by name (the table's rows with a writer).
WRITABLE = formats.writable()


@dataclasses.dataclass(frozen=True)
class Options:
  """The flags of --mode=export."""

  checkpoint_step: int | None = checkpoint_step_option()
  init_from: str | None = init_from_option()
  export_format: str = option(
      "hf", f"--mode=export: the format written: {', '.join(WRITABLE)} ("
      + "; ".join(f"{name}: {row.export_help}" for name, row in WRITABLE.items()) + ").")
  export_dir: str | None = option(
      None, "--mode=export: the folder the export goes to (required); an earlier export "
      "lingvo_lite wrote there is replaced, anything else is never overwritten.",
      non_empty=True)
  export_dtype: str | None = option(
      None, "--mode=export: the dtype of every tensor written: "
      + "; ".join(f"{name} {', '.join(row.writer.dtypes)}{row.writer.dtype_note}"
                  for name, row in WRITABLE.items())
      + " (default: the model's param_dtype).", non_empty=True)
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
  if options.export_format not in WRITABLE:
    raise UsageError(f"--export_format={options.export_format}: unknown format; valid "
                     f"choices: {', '.join(WRITABLE)}")
  if options.export_dir is None:
    raise UsageError("--export_dir: required for --mode=export; e.g. --export_dir=out/my_hf")
  dtype = options.export_dtype or param_dtype
  dtypes = WRITABLE[options.export_format].writer.dtypes
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
  refuse_model_changes(invocation, "export")
  dtype = _check_options(options, setup.model.param_dtype)
  shown_job = epath.Path(invocation.shown_job_dir or invocation.job_dir)
  opened = JobParams(setup, invocation.job_dir, shown_job, options.checkpoint_step,
                     devices=invocation.target.devices)
  export = WRITABLE[options.export_format].writer(ExportRequest(
      setup, dtype, options.export_dir, options.export_shard_bytes, opened,
      invocation.config_json))
  # Checked before the parameters are read: an earlier export of lingvo_lite's (its files
  # only) is replaced, anything else refused.
  flag = f"--export_dir={shown(options.export_dir)}"
  output = output_folders.check_folder(paths.resolve(options.export_dir, "--export_dir"),
                                       flag, export.kind, export.names + (outputs.MANIFEST,),
                                       "the export", invocation.job_dir)
  # A LoRA job's adapters alone (peft), or its parameters with them merged (the others).
  params, what = (opened.load_adapters() if getattr(export, "reads_adapters", False)
                  else opened.load())
  export.take(params)
  del params  # The writer keeps what it writes from (a host copy, where it makes one).
  written: dict[str, Any] = {}

  def write(folder: epath.Path) -> None:
    written.update(export.write(folder))
    _write_manifest(folder, export.kind, shown_job, opened.step, what, options.export_format,
                    dtype, written)

  replaced = _write_folder(output, write, flag, options.export_dir)
  # Only once the export is written: a failed one (a source that cannot be read, a full disk)
  # leaves a new job dir unmade.
  record_config_where_missing(invocation)
  print(f"exported {what} to {options.export_dir} "
        f"({'replaced the earlier export' if replaced else 'new'}): {options.export_format}, "
        f"{dtype}, {export.summary(written)}", flush=True)
  for line in export.details(written):
    print(line)


def _write_manifest(folder: epath.Path, kind: str, shown_job: epath.Path, step: int | None,
                    what: str, export_format: str, dtype: str, written: dict[str, Any]) -> None:
  manifest = {"schema": outputs.schema(kind), "job_log_dir": str(shown_job), "step": step,
              "parameters": what, "format": export_format, "dtype": dtype, **written}
  with file_writes.writing(folder / outputs.MANIFEST):
    (folder / outputs.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _write_folder(output: Any, write: Any, flag: str, export_dir: str) -> bool:
  """output_folders.write_folder, a failed write one line naming the file (nothing is left
  there)."""
  try:
    return output_folders.write_folder(output, write)
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
