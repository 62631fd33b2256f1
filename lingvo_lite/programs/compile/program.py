"""The compile program: compile a step ahead of time for a target and say whether it fits.

  python -m lingvo_lite --exp=GptJ6B --mode=compile --compile_topology=v5e-256 \\
      --job_log_dir=runs/gptj_v5e

Prints the report (programs/compile/compile_report.py) and writes it to
JOB/compile/report.{txt,json} when a job dir is given; `--compile_remat_policies=all` (or a
list) adds which remat policies fit at the configured batch, one compile each, and
`--compile_optimizer_options=all` which ways of keeping the optimizer's moments do
(programs/compile/setting_tables.py); `--compile_find_max_batch` adds the largest per-device
batch that fits (for each of those choices), `--compiled_step_out` saves the executable (of a step
that fits) for `--mode=train --compiled_step_in`. `--compile_program=eval` compiles the eval step;
`=decode` the decode functions (programs/compile/decode_compile.py: the generate loop and the
largest prefill, with the KV cache per device; `--compile_find_max_batch` then finds the
largest decode.slots).
Exit code 3 when the step (or a decode function) does not fit the target's memory.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from etils import epath

from lingvo_lite import output_folders, outputs, paths, target as targets, topologies
from lingvo_lite.errors import UsageError
from lingvo_lite.programs import Invocation, ProgramFailure, recorded_config, summarize_changes
from lingvo_lite.programs.options import init_from_option, option
from lingvo_lite.programs.compile import (aot, analyses, compile_report, compiled_steps,
                                          decode_compile, max_batch, setting_tables)
from lingvo_lite.runtime import summaries
from lingvo_lite.runtime.job_dirs import FILE, FOLDER, JobFiles
from lingvo_lite.weights import sources

EXIT_DOES_NOT_FIT = 3


@dataclasses.dataclass(frozen=True)
class Options:
  """The flags of --mode=compile, and the target they name."""

  compile_topology: str | None = option(
      None, "What --mode=compile compiles for: cpu:N (N virtual CPU devices), local (this "
      "host's devices), or a TPU slice (v4-8, v5e-8, v5e-256, v5p-128, v6e-8, ...; needs "
      "lingvo_lite[tpu]). The number counts TensorCores on v4/v5p, chips on v5e/v6e.",
      non_empty=True)
  compile_num_slices: int = option(
      1, "TPU slices joined over the data-center network (multi-slice; the mesh's dcn axes "
      "span them).")
  compile_program: Literal["train", "eval", "decode"] = option(
      "train", "What to compile: the train step, the eval step, or the decode functions (the "
      "generate loop and the largest prefill bucket, with decode.slots and "
      "decode.cache_length).")
  compile_find_max_batch: bool = option(
      False, "Also find the largest per-device batch that fits (with "
      "--compile_program=decode: the largest decode.slots); two compiles fit a line, then the "
      "prediction is confirmed.")
  compile_remat_policies: list[str] = option(
      [], "Also compile the step once per remat policy at the configured batch and show which "
      "fit, with the memory per device of each (e.g. none,full,minimal; 'all': every policy "
      "the target takes, models/remat.py); with --compile_find_max_batch, each one's largest "
      "batch too.", non_empty=True)
  compile_optimizer_options: list[str] = option(
      [], "Also compile the step once per way of keeping the optimizer's moments at the "
      "configured batch and show which fit: param_dtype (AdamW's default), bfloat16 "
      "(optimizer.moment_dtype), offload (optimizer.offload_state: in host memory between "
      "steps; TPU and GPU targets), bfloat16_offload; 'all': every one the target takes. With "
      "--compile_find_max_batch, each one's largest batch too.", non_empty=True)
  compiled_step_out: str | None = option(
      None, "--mode=compile: write the compiled train step and its manifest to this folder.")
  init_from: str | None = init_from_option()

  def config_parts(self, cfg: Any) -> dict[str, Any]:
    """A weight source's `model` (and `train.init_from`) from --init_from: the compile of a
    model a Hugging Face folder or GGUF file describes (weights/sources.py)."""
    return sources.config_parts(self.init_from, cfg)

  def cpu_devices(self) -> int | None:
    """The CPU devices `--compile_topology=cpu:N` needs (None for other topologies): JAX fixes
    their number when its backend starts, so the executor asks before anything runs."""
    return topologies.cpu_devices(self.compile_topology or "")

  def target(self) -> targets.Target:
    """What the program compiles for (the executor makes it the active target)."""
    if not self.compile_topology:
      raise UsageError("--compile_topology: required for --mode=compile; e.g. "
                       f"--compile_topology=v5e-8 (known: {topologies.known_names()})")
    return targets.compile_target(self.compile_topology, self.compile_num_slices)


# The report under JOB/compile/; a job dir that is not there yet is created for it.
JOB_FILES = JobFiles(creates=True, written=(
    ("compile", FOLDER), ("compile/report.txt", FILE), ("compile/report.json", FILE)))


def main(invocation: Invocation) -> int | None:
  options: Options = invocation.options
  setup, target = invocation.setup, invocation.target
  program = options.compile_program
  changes = invocation.config_changes()
  if changes:  # JOB/compile/ would describe another model than the job's.
    raise UsageError(
        f"--job_log_dir={invocation.shown_job_dir}: the config differs from "
        f"{recorded_config(invocation)} ({summarize_changes(changes)}); compile the job's own "
        "config (drop the overrides), or give another --job_log_dir (or none) for this one")
  if program == "eval" and setup.eval_data is None:
    raise UsageError("--compile_program=eval: this config has no eval_data; compile the "
                     "train step or set eval_data")
  tables = _tables(options, setup, target)
  if options.compiled_step_out and program != "train":
    raise UsageError("--compiled_step_out: only the train step is saved (train loads it); "
                     f"drop --compile_program={program}")
  step_out = compiled_steps.check_out_path(options.compiled_step_out, invocation.job_dir)
  if invocation.job_dir is None:  # The report goes to stdout alone.
    outputs.check_stdout("--mode=compile", "run it with stdout open, or pass --job_log_dir=JOB "
                         "to write the report to JOB/compile/")
  with analyses.kept_in(invocation.cache_folder):
    if program == "decode":
      result = decode_compile.compile_decode(setup, target)
      report = decode_compile.build(result)
      if options.compile_find_max_batch:
        report["max_slots"] = decode_compile.search_slots(setup, target, result)
      text = decode_compile.to_text(report)
    else:
      # The saved step is the executable itself: compiled, never an earlier compile's analyses.
      result = aot.compile_step(setup, target, program, need_executable=step_out is not None)
      report = _step_report(options, setup, target, tables, result)
      text = compile_report.to_text(report)
  printed = _print_report(text)
  fits = report["verdict"] != compile_report.DOES_NOT_FIT
  _write_outputs(invocation, step_out, result, report, text, fits)
  if printed is not None:  # The report is in the files, if a job dir was given.
    where = (f"; it is in {epath.Path(invocation.shown_job_dir) / 'compile' / 'report.txt'}"
             if invocation.job_dir is not None else "")
    raise ProgramFailure(outputs.failed_write("the report to stdout", printed,
                                              "compile again", to_stdout=True) + where)
  return None if fits else EXIT_DOES_NOT_FIT


def _tables(options: Options, setup: Any, target: targets.Target
            ) -> list[tuple[setting_tables.Table, list[str]]]:
  """The setting tables asked for (setting_tables.py), each with the choices it names, checked
  and their setups validated before any compile."""
  asked = [(table, getattr(options, table.flag.lstrip("-"))) for table in setting_tables.TABLES]
  tables = []
  for table, names in asked:
    if names and options.compile_program == "decode":
      raise UsageError(f"{table.flag}: the decode functions take no gradients and no "
                       "optimizer step, so it changes nothing there; drop it (or compile the "
                       "train step)")
    chosen = table.check_names(names, target.platform)
    table.check_setups(setup, target, chosen)
    if chosen:
      tables.append((table, chosen))
  return tables


def _step_report(options: Options, setup: Any, target: targets.Target,
                 tables: list[tuple[setting_tables.Table, list[str]]],
                 result: aot.CompileResult) -> dict[str, Any]:
  """The train or eval step's report: the config's own compile, each table's compiles at the
  configured batch and, with --compile_find_max_batch, the largest batch of each choice (of the
  config's own where no table is asked for)."""
  program = options.compile_program
  report = compile_report.build(result)
  rows = []
  for table, names in tables:
    compiled = table.compile_each(setup, target, program, names, result)
    report[table.key] = table.build(setup, compiled)
    rows += [max_batch.Row(table.column, name, table.apply(setup, name), compiled[name])
             for name in names]
  if options.compile_find_max_batch:
    rows = rows or [max_batch.Row("remat_policy", setup.model.remat_policy, setup, result)]
    report["max_batch"] = max_batch.search(target, program, rows)
  return report


def _print_report(text: str) -> OSError | None:
  """Prints the report; the error if stdout cannot take it (then silenced: the files are
  still written, and the failure is reported after them)."""
  try:
    print(text, end="", flush=True)
  except OSError as e:
    outputs.silence_stdout()
    return e
  return None


def _write_outputs(invocation: Invocation, step_out: output_folders.FolderOutput | None,
                   result: aot.CompileResult, report: dict, text: str, fits: bool) -> None:
  """The saved step (of a step that fits), then JOB/compile/report.{json,txt}: a step folder
  that fails leaves the job's report as it was, and a failed report removes the folder it
  created."""
  options: Options = invocation.options
  what = "the compiled step to " + str(options.compiled_step_out)
  try:
    if step_out is not None and result.executable is not None and fits:
      replaced = compiled_steps.save(step_out, result)
      done = (f"replaced the compiled step lingvo_lite wrote earlier in "
              f"{options.compiled_step_out}" if replaced else
              f"compiled step saved to {options.compiled_step_out}")
      summaries.log(f"{done} (load with --mode=train --compiled_step_in="
                    f"{options.compiled_step_out})", True)
    elif step_out is not None:
      summaries.log("no compiled step saved: the step does not fit the target", True)
    if invocation.job_dir is not None:
      shown = epath.Path(invocation.shown_job_dir) / "compile"
      what = f"the compile report to {shown}"
      folder = invocation.job_dir / "compile"
      with outputs.created_folders(folder) as new:
        try:
          paths.write_atomically(folder / "report.json", json.dumps(report, indent=2) + "\n")
          paths.write_atomically(folder / "report.txt", text)
        except OSError:
          if new:  # Not half a report in a folder of this run's own.
            (folder / "report.json").unlink(missing_ok=True)
          raise
      summaries.log(f"report written to {shown}", True)
  except OSError as e:
    raise ProgramFailure(outputs.failed_write(what, e, "compile again")) from None
