"""The programs `--mode` runs, in one table: their names, what they need, their docs.

A program is a module with `main(invocation)`, which may also declare `Options` (a frozen
dataclass, one field per flag: programs/options.py) and `JOB_FILES` (what it writes in the job
dir: runtime/job_dirs.JobFiles). The executor builds the `Invocation` (the validated Setup, the
job dir, the target, the options filled from the command line), defines every program's flags
from their `Options`, and never branches on a program's name: what differs between programs is
a field of its entry here. Adding a program is one module and one entry here.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
from typing import Any, Callable, Sequence

from etils import epath

from lingvo_lite.errors import UsageError
from lingvo_lite.programs.options import NoOptions
from lingvo_lite.runtime.job_dirs import JobFiles


class ProgramFailure(RuntimeError):
  """A program started and cannot go on (exit code 1): a non-finite loss, a failed save."""


@dataclasses.dataclass(frozen=True)
class Program:
  """One `--mode` choice.

  Attributes:
    name: The `--mode` value.
    summary: One line for --help.
    module: The module (under lingvo_lite.programs) whose `main(invocation)` runs it.
    needs_config: Builds a Setup from an experiment or a config.json (list does not; nor
      does report, which reads a job dir's files only: no Setup, no device).
    needs_job_dir: `--job_log_dir` is required.
    joins_distributed: Runs in every process of a multi-process run (jax.distributed).
    prints_results: Its results are what it prints on stdout (print, list), so a closed
      stdout is refused before it runs: Python would drop every line without a word.
    compilation_cache: Its compiles go through JAX's persistent compilation cache, so a
      restarted run skips them. Off for programs that compile nothing, and for compile, whose
      compile time is a reported figure and whose saved executable must not come out of the
      cache (XLA:CPU cannot serialize one that did): the cache is switched off around them.
    keeps_compile_analyses: It keeps XLA's analyses of its compiles in the cache folder
      (programs/compile/analyses.py) and reads them for the same compile again: the compile
      program, whose TPU executables JAX's cache cannot load back.
    target_from_options: It runs on (compiles for) the target its options name
      (`Options.target()`, with `Options.cpu_devices()` asked before anything touches a
      device), not on this host's devices.
  """

  name: str
  summary: str
  module: str
  needs_config: bool = True
  needs_job_dir: bool = False
  joins_distributed: bool = False
  prints_results: bool = False
  compilation_cache: bool = True
  keeps_compile_analyses: bool = False
  target_from_options: bool = False

  def _module(self) -> types.ModuleType:
    return importlib.import_module(f"lingvo_lite.programs.{self.module}")

  @property
  def options_class(self) -> type:
    """Its `Options` dataclass (programs/options.py); NoOptions where it declares none."""
    return getattr(self._module(), "Options", NoOptions)

  @property
  def flags(self) -> tuple[str, ...]:
    """The flags its options declare; other programs refuse them unless they declare them too."""
    return tuple(field.name for field in dataclasses.fields(self.options_class))

  @property
  def job_files(self) -> JobFiles:
    """What it does with a job dir (its module's JOB_FILES); by default it only reads one."""
    return getattr(self._module(), "JOB_FILES", JobFiles())

  def main(self, invocation: "Invocation") -> int | None:
    """Runs the program; returns its exit code (None is 0)."""
    return self._module().main(invocation)


@dataclasses.dataclass(frozen=True)
class Invocation:
  """What the executor hands a program: everything it needs, nothing of Fiddle's.

  Attributes:
    setup: The built and validated Setup (None for programs without a config).
    job_dir: The resolved job dir, or None when none was given.
    shown_job_dir: The job dir as the user wrote it (relative stays relative), for messages.
    target: The devices the program runs on or compiles for (lingvo_lite.target.Target).
    options: This program's `Options`, filled from the command line.
    command_line: The command line as the executor parsed it (argv, the program's name
      first), for the run's record (run_info.jsonl).
    config_text: Makes the flattened config (config.txt's text), for the programs that
      show it.
    config_json: Makes config.json's text (reloadable by --fdl_config_file).
    config_svg: Draws the config as an SVG picture (lingvo_lite.config.graph); raises
      UsageError where Graphviz is missing.
    write_config: Writes config.json and config.txt into the job dir.
    config_changes: Given a job dir's recorded config path, the fields that differ from this
      config as `path: old -> new` (none when the job has no config yet).
    cache_folder: The run's compilation cache folder (None: none), for a program that keeps
      its own things there (runtime/kept_results.py: compile analyses, the host's matmul
      peak).
  """

  setup: Any
  job_dir: epath.Path | None
  shown_job_dir: str | None
  target: Any
  options: Any
  command_line: Sequence[str] = ()
  config_text: Callable[[], str] = lambda: ""
  config_json: Callable[[], str] = lambda: ""
  config_svg: Callable[[], str] = lambda: ""
  write_config: Callable[[], None] = lambda: None
  config_changes: Callable[[], list[str]] = lambda: []
  cache_folder: str | None = None


def summarize_changes(changes: list[str]) -> str:
  """The first three of `Invocation.config_changes()`, for a one-line message."""
  return "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3
                                   else "")


def recorded_config(invocation: Invocation) -> str:
  """The job's recorded config (JOB/config.json) in words, for a message refusing another:
  the one this job was trained with; or, for a job that has no checkpoint (one that
  decode, serve, eval or export made from `train.init_from`, or a training that saved none
  yet), the one it recorded when first run, and where its parameters come from."""
  checkpoints = invocation.job_dir / "checkpoints" if invocation.job_dir is not None else None
  if checkpoints is not None and checkpoints.is_dir() and any(
      step.name.isdigit() for step in checkpoints.iterdir()):
    return "the one this job was trained with"
  source = invocation.setup.train.init_from if invocation.setup is not None else None
  if source is not None:
    return (f"the one it was first run with, on train.init_from={source.describe()}, having "
            "no checkpoint of its own")
  return "the one it was first run with, having no checkpoint"


def refuse_model_changes(invocation: Invocation, verb: str) -> None:
  """A model config other than the job's would read its parameters (its checkpoints, or its
  `train.init_from`) as another model's, even where the shapes agree (another norm,
  activation or rotary setting): one line instead."""
  changes = [c for c in invocation.config_changes() if c.startswith("model.")]
  if changes:
    raise UsageError(f"--job_log_dir={invocation.shown_job_dir}: the model config differs "
                     f"from {recorded_config(invocation)} ({summarize_changes(changes)}); "
                     f"{verb} with the job's own config (drop the --exp and model overrides)")


def record_config_where_missing(invocation: Invocation) -> None:
  """A job dir a program was first run on (decode, eval, export from --exp) records the config
  it ran with, so later programs and tools can name just the job dir (JobFiles.records_config).
  One with a config keeps it, and one with checkpoints but no config (its config moved away) is
  left as it is: the config given may not be the one they were trained with."""
  job_dir = invocation.job_dir
  if job_dir is not None and not (job_dir / "config.json").exists() and not (
      job_dir / "checkpoints").exists():
    invocation.write_config()


PROGRAMS: dict[str, Program] = {p.name: p for p in (
    Program("train", "train the experiment, resuming from the job's latest checkpoint",
            "train", needs_job_dir=True, joins_distributed=True),
    Program("eval", "evaluate the job's latest checkpoint (or --checkpoint_step, or each as "
            "it lands: --eval_continuous) on its eval sets", "eval",
            needs_job_dir=True, joins_distributed=True),
    Program("decode", "generate completions of --prompt / --prompts_file prompts with the "
            "job's latest checkpoint (or --checkpoint_step), KV-cached, sampled per request",
            "decode", needs_job_dir=True),
    Program("serve", "serve the job's latest checkpoint (or --checkpoint_step, or "
            "--init_from weights) over an OpenAI-style HTTP API (/v1/completions, "
            "/v1/chat/completions) with continuous batching", "serve", needs_job_dir=True),
    Program("export", "write the job's latest checkpoint (or --checkpoint_step) as a Hugging "
            "Face folder (--export_format=hf) at --export_dir", "export", needs_job_dir=True,
            compilation_cache=False),
    Program("compile", "compile the train step (or the eval step, or the decode functions) "
            "ahead of time for a target topology: memory verdict, step time, maximum batch, a "
            "saved executable",
            "compile.program", compilation_cache=False, keeps_compile_analyses=True,
            target_from_options=True),
    Program("print", "print the flattened config (after overrides) and validate it; "
            "--format=json prints config.json, --format=svg a picture of it", "print_config",
            prints_results=True, compilation_cache=False),
    Program("list", "list the registered experiments", "list_experiments",
            needs_config=False, prints_results=True, compilation_cache=False),
    Program("report", "write JOB/report/index.html, one offline page of the job's run, "
            "plots, evals, checkpoints and config (--compare=B,C: A/report/compare.html)",
            "report", needs_config=False, needs_job_dir=True, compilation_cache=False),
)}
