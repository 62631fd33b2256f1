"""Beam's pipeline options for a store build: the options a build runs with, and the check
that refuses options Beam would refuse or drop, before anything runs (bin/build_store.py's
`--pipeline_arg`, the README's "Data: token stores")."""

from __future__ import annotations

import contextlib
import io
from typing import Sequence

from lingvo_lite.errors import UsageError, config_error, error_cause, one_line


def import_beam():
  """apache_beam, imported without its "apitools not found" log line."""
  import logging  # pylint: disable=g-import-not-at-top
  root_level = logging.getLogger().level
  logging.getLogger().setLevel(logging.ERROR)  # "apitools not found" at Beam's import.
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  logging.getLogger().setLevel(root_level)
  return beam


def pipeline_options(workers: int, pipeline_args: Sequence[str]):
  """Beam's options for `pipeline_args`; without a runner, the DirectRunner on `workers`
  processes (this one alone for 1)."""
  # pylint: disable-next=g-import-not-at-top
  from apache_beam.options.pipeline_options import PipelineOptions
  args = list(pipeline_args)
  if not any(a.startswith("--runner") for a in args):
    args += ["--runner=DirectRunner", f"--direct_num_workers={workers}",
             "--direct_running_mode=" + ("multi_processing" if workers > 1 else "in_memory")]
  args.append("--default_sdk_harness_log_level=WARNING")
  return PipelineOptions(args)


def check_pipeline_args(pipeline_args: Sequence[str], flag: str = "--pipeline_arg") -> None:
  """Refuses Beam pipeline options that Beam would refuse or ignore, before anything runs.

  Beam parses them only once the pipeline starts, where a bad value ends the process with
  its usage text (on the build's log, not the terminal) and an unknown option is dropped with
  a warning, so a typo such as `--runer=DataflowRunner` would build on this machine.

  Raises:
    UsageError: a value Beam's parser refuses, an option no Beam options class defines, an
      argument that is not an option, or a runner that Beam cannot make here.
  """
  if not pipeline_args:
    return
  import_beam()
  given = pipeline_args[0] if len(pipeline_args) == 1 else " ".join(pipeline_args)

  def refuse(value: str, problem: str, fix: str = "see Beam's pipeline options") -> UsageError:
    return UsageError(one_line(str(config_error(flag, value, problem, fix))))

  parsers = []

  def capture(parser) -> None:
    def error(message: str):
      raise refuse(given, f"Beam refuses it ({message})")
    parser.error = error  # Beam's own exits the process with its usage text.
    parsers.append(parser)

  import logging  # pylint: disable=g-import-not-at-top
  beam_logger = logging.getLogger("apache_beam.options.pipeline_options")
  level = beam_logger.level
  beam_logger.setLevel(logging.ERROR)  # Its "Discarding unparseable args" becomes the error.
  try:
    with contextlib.redirect_stdout(io.StringIO()):  # What `--help` would print.
      options = pipeline_options(1, pipeline_args)
    options.get_all_options(add_extra_args_fn=capture)
    _, unknown = parsers[0].parse_known_args(list(pipeline_args))
    runner = options.get_all_options().get("runner")
  except SystemExit:  # `--help`: argparse prints the help and exits.
    raise refuse(given, "asks Beam's option parser to exit (its --help?)") from None
  finally:
    beam_logger.setLevel(level)
  if unknown:
    raise refuse(unknown[0], "not a Beam pipeline option (Beam would drop it)",
                 "spell it as Beam does, e.g. --pipeline_arg=--runner=DataflowRunner")
  if runner:
    from apache_beam.runners import runner as runners  # pylint: disable=g-import-not-at-top
    try:
      runners.create_runner(runner)
    except (ImportError, ValueError) as e:
      # Beam's text goes on to list every runner it has.
      raise refuse(f"--runner={runner}", f"Beam cannot use this runner here "
                   f"({error_cause(e).split('. ')[0]})",
                   "give a runner Beam knows, e.g. DirectRunner or DataflowRunner, and install "
                   "what it needs") from None
