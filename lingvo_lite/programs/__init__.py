"""The programs `--mode` runs, in one table: their names, what they need, their flags, docs.

A program is a module with `main(invocation)`; the executor builds the `Invocation` (the
validated Setup, the job dir, the target) and never branches on the mode itself. Adding a
program is one entry here and one module.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from etils import epath

from lingvo_lite.errors import UsageError


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
    flags: The executor's flags only this program reads; other modes refuse them.
    prints_results: Its results are what it prints on stdout (print, list), so a closed
      stdout is refused before it runs: Python would drop every line without a word.
  """

  name: str
  summary: str
  module: str
  needs_config: bool = True
  needs_job_dir: bool = False
  joins_distributed: bool = False
  flags: tuple[str, ...] = ()
  prints_results: bool = False

  def main(self, invocation: "Invocation") -> int | None:
    """Runs the program; returns its exit code (None is 0)."""
    module = importlib.import_module(f"lingvo_lite.programs.{self.module}")
    return module.main(invocation)


@dataclasses.dataclass(frozen=True)
class Invocation:
  """What the executor hands a program: everything it needs, nothing of Fiddle's.

  Attributes:
    setup: The built and validated Setup (None for programs without a config).
    job_dir: The resolved job dir, or None when none was given.
    shown_job_dir: The job dir as the user wrote it (relative stays relative), for messages.
    target: The devices the program runs on or compiles for (lingvo_lite.target.Target).
    options: This program's flag values, by flag name.
    config_text: Makes the flattened config (config.txt's text), for the programs that
      show it.
    config_json: Makes config.json's text (reloadable by --fdl_config_file).
    config_svg: Draws the config as an SVG picture (lingvo_lite.config.graph); raises
      UsageError where Graphviz is missing.
    write_config: Writes config.json and config.txt into the job dir.
    config_changes: Given a job dir's recorded config path, the fields that differ from this
      config as `path: old -> new` (none when the job has no config yet).
  """

  setup: Any
  job_dir: epath.Path | None
  shown_job_dir: str | None
  target: Any
  options: dict[str, Any]
  config_text: Callable[[], str] = lambda: ""
  config_json: Callable[[], str] = lambda: ""
  config_svg: Callable[[], str] = lambda: ""
  write_config: Callable[[], None] = lambda: None
  config_changes: Callable[[], list[str]] = lambda: []


def summarize_changes(changes: list[str]) -> str:
  """The first three of `Invocation.config_changes()`, for a one-line message."""
  return "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3
                                   else "")


def refuse_model_changes(invocation: Invocation, verb: str) -> None:
  """A model config other than the job's would read its checkpoints as another model's, even
  where the shapes agree (another norm, activation or rotary setting): one line instead."""
  changes = [c for c in invocation.config_changes() if c.startswith("model.")]
  if changes:
    raise UsageError(f"--job_log_dir={invocation.shown_job_dir}: the model config differs "
                     f"from the one its checkpoints were trained with "
                     f"({summarize_changes(changes)}); {verb} with the job's own config "
                     "(drop the --exp and model overrides)")


PROGRAMS: dict[str, Program] = {p.name: p for p in (
    Program("train", "train the experiment, resuming from the job's latest checkpoint",
            "train", needs_job_dir=True, joins_distributed=True, flags=("compiled_step_in",)),
    Program("eval", "evaluate the job's latest checkpoint (or --checkpoint_step, or each as "
            "it lands: --eval_continuous) on its eval sets", "eval",
            needs_job_dir=True, joins_distributed=True,
            flags=("checkpoint_step", "eval_continuous", "eval_timeout_seconds",
                   "eval_poll_seconds", "eval_sets")),
    Program("decode", "generate completions of --prompt / --prompts_file prompts with the "
            "job's latest checkpoint (or --checkpoint_step), KV-cached, sampled per request",
            "decode", needs_job_dir=True,
            flags=("checkpoint_step", "prompt", "prompts_file", "decode_out")),
    Program("compile", "compile the train step (or the eval step, or the decode functions) "
            "ahead of time for a target topology: memory verdict, step time, maximum batch, a "
            "saved executable",
            "compile.program", flags=("compile_topology", "compile_num_slices", "compile_program",
                              "compile_find_max_batch", "compile_remat_policies",
                              "compiled_step_out")),
    Program("print", "print the flattened config (after overrides) and validate it; "
            "--format=json prints config.json, --format=svg a picture of it", "print_config",
            flags=("format",), prints_results=True),
    Program("list", "list the registered experiments", "list_experiments",
            needs_config=False, prints_results=True),
    Program("report", "write JOB/report/index.html, one offline page of the job's run, "
            "plots, evals, checkpoints and config (--compare=B,C: A/report/compare.html)",
            "report", needs_config=False, needs_job_dir=True, flags=("compare",)),
)}
