"""The command-line executor: the only module that defines flags.

  python -m lingvo_lite --exp=PyCodeTiny --mode=train --job_log_dir=runs/tiny \\
      --fiddler=tiny --fdl.model.num_layers=2 --fdl.train.steps=50

Flow: flags -> base config (an experiment, a config function, or a config.json) ->
fiddlers and `--fdl.path=value` overrides in command-line order -> `fdl.build` ->
`Setup.validate()` -> the program of `--mode`. Mistakes in the command or the config end
with one line on stderr and exit code 2 before any device time is spent.

Longer than 300 lines with a reason: it is the one module that defines flags (the command
line's contract in one place: the shared flags, each program's options turned into flags, and
their one-line errors), and the one that assembles a config from them.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

from absl import app, flags

import fiddle as fdl
import jax
from etils import epath

from lingvo_lite import command_line, outputs, paths, programs, target as targets
from lingvo_lite.config import (building, files as config_files, graph as config_graph,
                                help as config_help, overrides, registry)
from lingvo_lite.errors import DataError, OutputFailure, UsageError, one_line
from lingvo_lite.experiment import Setup
from lingvo_lite.programs import options as program_options
from lingvo_lite.runtime import (compilation_cache, distributed, job_dirs, library_logs,
                                 stack_dumps, supervisor)

MODES = tuple(programs.PROGRAMS)
# What --help prints first: the docstring's usage, without its note to readers of the code.
_USAGE = __doc__.split("\n\nLonger than 300 lines")[0].strip()


def _define_name(name: str, default: str | None, help_string: str) -> flags.FlagHolder[str]:
  """A string flag naming something (an experiment, a path, an address): given empty, it is
  refused rather than read as left out (command_line.NonEmptyParser)."""
  return flags.DEFINE(command_line.NonEmptyParser(), name, default, help_string,
                      serializer=flags.ArgumentSerializer())


def _define_names(name: str, default: list[str], help_string: str
                  ) -> flags.FlagHolder[list[str]]:
  """A comma-separated list flag refused empty, or with an empty item."""
  return flags.DEFINE(command_line.NonEmptyListParser(), name, default, help_string,
                      serializer=flags.CsvListSerializer(","))


_EXP = _define_name(
    "exp", None, "Registered experiment: full name (lm.pycode.PyCodeTiny), a unique dotted "
    "suffix (PyCodeTiny) or an import path.")
_FDL_CONFIG = _define_name(
    "fdl_config", None, "Like --exp; also a function returning a config, with literal "
    "arguments: 'module.fn(layers=4)'.")
_FDL_CONFIG_FILE = _define_name(
    "fdl_config_file", None, "A config.json written by a previous run.")
# --fiddler, --fdl_set and --fdl.PATH=VALUE share one log, so they apply in command-line order
# whatever spelling absl accepted (see command_line.py).
_OVERRIDES = command_line.OverrideLog()
flags.DEFINE_flag(command_line.OverrideFlag(
    "fiddler", "fiddler", "--fiddler={}", _OVERRIDES,
    "Named config mutation (the experiment's, its module's, or generic: tiny, synthetic_data, "
    "no_eval; or module.function). Applied in command-line order with the sets."))
flags.DEFINE_flag(command_line.OverrideFlag(
    "fdl_set", "set", "--fdl_set={}", _OVERRIDES,
    "PATH=VALUE: sets one config field, VALUE a Python literal; same as --fdl.PATH=VALUE."))
flags.DEFINE_flag(command_line.OverrideFlag(
    command_line.DOTTED_FLAG, "set", "--fdl.{}", _OVERRIDES,
    "Internal: --fdl.PATH=VALUE arrives here (write --fdl.PATH=VALUE)."))
_EXPERIMENTS_MODULE = _define_names(
    "experiments_module", [], "Modules to import before looking experiments up, e.g. "
    "my_project.experiments (comma-separated); their @register classes join --mode=list.")
_FDL_HELP = flags.DEFINE_bool(
    "fdl_help", False, "Lists every field of the chosen config (type, value, origin, doc) "
    "and the fiddlers that apply, then exits.")
_MODE = flags.DEFINE_enum("mode", "train", MODES, "Program to run: " + "; ".join(
    f"{p.name}: {p.summary}" for p in programs.PROGRAMS.values()) + ".")
_JOB_LOG_DIR = _define_name(
    "job_log_dir", None, "Job folder: config, checkpoints, metrics, summaries (local or "
    "remote path).")
_COMPILATION_CACHE_DIR = flags.DEFINE_string(
    "compilation_cache_dir", compilation_cache.DEFAULT_FOLDER,
    "Persistent JAX compilation cache, so a restarted run skips compiling (default: "
    "$JAX_COMPILATION_CACHE_DIR where it is set); '' disables it, whatever JAX was told.")


def _define_option(declared: program_options.DeclaredOption) -> None:
  """The flag of one program option (programs/options.py), defined in this module so that
  --help lists it with the others."""
  name, default, doc = declared.name, declared.default, declared.help
  kind = declared.kind
  if kind == program_options.STRING:
    if declared.non_empty:
      _define_name(name, default, doc)
    else:
      flags.DEFINE_string(name, default, doc)
  elif kind == program_options.LIST:
    if declared.non_empty:
      _define_names(name, default, doc)
    else:
      flags.DEFINE_list(name, default, doc)
  elif kind == program_options.ENUM:
    flags.DEFINE_enum(name, default, declared.choices, doc)
  else:
    define = {program_options.BOOL: flags.DEFINE_bool,
              program_options.INTEGER: flags.DEFINE_integer,
              program_options.FLOAT: flags.DEFINE_float,
              program_options.MULTI_STRING: flags.DEFINE_multi_string}[kind]
    define(name, default, doc)


def _define_program_flags() -> None:
  """Each program's own flags, from the options its module declares (one flag for an option
  that two programs share); `_refuse_flags` refuses those the chosen program does not read."""
  for declared in program_options.declared_options(
      program.options_class for program in programs.PROGRAMS.values()):
    _define_option(declared)


_define_program_flags()

_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ("auto", "on", "off"),
    "Multi-process runs through jax.distributed: auto = when --coordinator_address is given "
    "or a SLURM / Open MPI / TPU pod environment is detected.")
_COORDINATOR_ADDRESS = _define_name(
    "coordinator_address", None, "host:port of process 0, which hosts the coordinator.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, from 0.")
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "heartbeat_timeout_seconds", 100,
    "A process silent for this long counts as dead and every process stops (JAX's default).")
_INIT_TIMEOUT = flags.DEFINE_integer(
    "distributed_init_timeout_seconds", distributed.DEFAULT_INIT_TIMEOUT_SECONDS,
    "How long a process waits at start-up for the coordinator and every other process to "
    "join; it says what it waits for every few seconds, and gives up after this (exit 1).")

def override_log() -> command_line.OverrideLog:
  """The overrides of the parsed command line, in order (for tests and tools)."""
  return _OVERRIDES


def _fail(message: str, code: int = 2) -> None:
  """Prints the one error line (errors.one_line: what the user typed may hold a newline or
  undecodable bytes) and exits."""
  print(f"lingvo_lite: error: {one_line(message)}", file=sys.stderr, flush=True)
  sys.exit(code)


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl flags_parser: expands flag files, answers --help, parses; one-line errors.

  Returns:
    `argv` itself, which absl's app.run hands to `main`: the command line as parsed (a
    positional argument is refused here, so there is no other use for main's argument).
  """
  try:
    args = command_line.expand(argv, flags.FLAGS)
    wanted_help = command_line.help_requested(args)
    if wanted_help:
      with outputs.stdout_failures():
        _print_help(wanted_help)
        _flush_stdout()
      sys.exit(0)
    positional = flags.FLAGS(args)
  except (flags.Error, ValueError) as e:
    _fail(str(e).splitlines()[0])
  except UsageError as e:
    _fail(str(e))
  except outputs.StdoutWriteError as e:  # A reader that closed the pipe, a full disk.
    _fail(outputs.failed_write("the help to stdout", e, "run it again", to_stdout=True),
          code=1)
  if len(positional) > 1:
    _fail(f"unexpected argument {positional[1]!r}; flags take the form --name=value")
  return list(argv)


def _flush_stdout() -> None:
  """Flushes stdout inside the program, so that a reader that closed the pipe is met here,
  where it is one line, and not at interpreter exit (a traceback and exit code 120)."""
  if sys.stdout is not None and not sys.stdout.closed:
    sys.stdout.flush()


def _print_help(kind: str) -> None:
  """--help: this module's flags; --helpfull: every flag (absl's own handlers exit 1)."""
  if kind == "xml":
    flags.FLAGS.write_help_in_xml_format(sys.stdout)
    return
  print(_USAGE + "\n")
  if kind == "full":
    print(flags.FLAGS.get_help())
  else:
    print("Flags:\n" + flags.FLAGS.module_help(sys.modules[__name__]).split("\n", 1)[1])
    print("\n--fdl_help lists the fields and fiddlers of a config; --helpfull lists every flag.")


# ----------------------------------------------------------------------------- configs


def base_config(job_dir: epath.Path | None) -> tuple[fdl.Config, type | None]:
  """The config named by --exp, --fdl_config or --fdl_config_file, else JOB/config.json,
  and the experiment class it came from (None for a config function).

  The config is checked to be a Setup's here, the one place every mode and --fdl_help get
  it from, before anything reads a field of it (building.require_setup); it comes with the
  default parts it leaves out.
  """
  given = [(f"--{flag.name}", flag.value) for flag in (_EXP, _FDL_CONFIG, _FDL_CONFIG_FILE)
           if flag.value]
  if len(given) > 1:
    raise UsageError(f"{' and '.join(f'{k}={v}' for k, v in given)}: conflicting flags; "
                     "give only one of --exp, --fdl_config, --fdl_config_file")
  if given and given[0][0] != "--fdl_config_file":
    cfg, experiment = registry.config_from_flag(*given[0])
    return building.require_setup(cfg, "=".join(given[0])), experiment
  if given:
    flag, path = given[0][0], paths.resolve(given[0][1], given[0][0])
  elif job_dir is not None and (job_dir / config_files.CONFIG_JSON).exists():
    flag, path = "--job_log_dir", job_dir / config_files.CONFIG_JSON
  else:
    where = f" and {job_dir} holds no {config_files.CONFIG_JSON}" if job_dir else ""
    raise UsageError(f"--exp: no experiment given{where}; pass --exp=NAME (see --mode=list), "
                     "--fdl_config_file=PATH, or a --job_log_dir of an earlier run")
  cfg = building.require_setup(config_files.load(path, flag), f"{flag}={path}",
                               building.FIX_FILE)
  # The experiment's own fiddlers still apply to its reloaded config, if it still exists.
  recorded = config_files.recorded_experiment(path)
  return cfg, registry.recorded_class(recorded)[0] if recorded else None


build = building.build


def build_experiment(name: str, assignments: Sequence[str] = ()) -> Setup:
  """The registered experiment `name` with `PATH=VALUE` assignments applied in order (as
  --fdl_set applies them), built and validated: for scripts that take no lingvo_lite flags."""
  cfg = building.require_setup(registry.lookup(name).config(), name)
  overrides.apply(cfg, [overrides.set_directive(f"--set {a}", a) for a in assignments], None)
  return build(cfg)


# ----------------------------------------------------------------------------- modes


# What only a mode with a config uses; --mode=list refuses them rather than ignore them.
_CONFIG_FLAGS = ("exp", "fdl_config", "fdl_config_file", "fiddler", "fdl_set",
                 command_line.DOTTED_FLAG, "fdl_help", "job_log_dir")


def _refuse_flags(program: programs.Program) -> None:
  """A flag the program does not read is refused, never silently ignored."""
  # Without a config (list, report), the config flags are refused; report reads a job dir.
  foreign = [] if program.needs_config else [
      name for name in _CONFIG_FLAGS if not (name == "job_log_dir" and program.needs_job_dir)]
  for other in programs.PROGRAMS.values():
    if other is not program:
      foreign += [name for name in other.flags if name not in program.flags]
  for name in foreign:
    if flags.FLAGS[name].present:
      shown = "--fdl.PATH=VALUE" if name == command_line.DOTTED_FLAG else f"--{name}"
      readers = [p.name for p in programs.PROGRAMS.values() if name in p.flags]
      if not readers:
        takes = "takes no config" + ("" if program.needs_job_dir else " or job dir")
        # The summary is an imperative phrase ("list the registered experiments").
        raise UsageError(f"{shown}: --mode={program.name} {takes} (it is the mode to "
                         f"{program.summary}); drop the flag, or pick another --mode")
      raise UsageError(f"{shown}: --mode={program.name} does not use this flag (only "
                       f"--mode={' / --mode='.join(readers)} reads it); drop the flag, or "
                       "pick another --mode")


def _config_changes(job_dir: epath.Path | None, cfg: fdl.Buildable) -> list[str]:
  """Fields of `cfg` that differ from JOB/config.json in what shapes the state."""
  existing = job_dir / config_files.CONFIG_JSON if job_dir is not None else None
  if existing is None or not existing.exists():
    return []
  return config_files.incompatible_changes(config_files.load(existing, "--job_log_dir"), cfg)


def _compilation_cache(program: programs.Program) -> compilation_cache.CompilationCache:
  """The run's compilation cache, checked before anything runs: used by the programs whose
  compiles it serves (Program.compilation_cache: JAX's; Program.keeps_compile_analyses: the
  compile program's own)."""
  used = ((program.compilation_cache or program.keeps_compile_analyses)
          and not _FDL_HELP.value)
  job_dir = (paths.resolve(_JOB_LOG_DIR.value, "--job_log_dir") if _JOB_LOG_DIR.value
             and _COMPILATION_CACHE_DIR.present else None)
  return compilation_cache.choose(_COMPILATION_CACHE_DIR.value,
                                  _COMPILATION_CACHE_DIR.present, used, job_dir,
                                  for_jax=program.compilation_cache)


def main(argv: Sequence[str]) -> None:
  """Runs the program of --mode. `argv` is the command line as `parse_flags` parsed it, for
  the programs that record it (train's run_info.jsonl)."""
  if not flags.FLAGS["verbosity"].present:
    library_logs.quiet()  # -v 0 shows what it quiets.
  try:
    program = programs.PROGRAMS[_MODE.value]
    options = program.options_class(**{name: flags.FLAGS[name].value for name in program.flags})
    if program.prints_results:
      outputs.check_stdout(f"--mode={program.name}", "give it a stdout (or redirect it to a "
                           "file: > FILE)")
    # Flags that cannot work fail before anything runs (before a supervised child starts).
    cache = _compilation_cache(program)
    if program.joins_distributed:
      distributed.check_timeouts(_HEARTBEAT_TIMEOUT.value, _INIT_TIMEOUT.value)
      distributed.plan(_DISTRIBUTED.value, _COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value,
                       _PROCESS_ID.value)
      if supervisor.wanted(_DISTRIBUTED.value, _COORDINATOR_ADDRESS.value):
        # The runtime's raw C++ log is held back unless the user asked for logs (-v).
        sys.exit(supervisor.supervise(sys.argv[1:],
                                      quiet_runtime_log=not flags.FLAGS["verbosity"].present))
    # `kill -USR1 PID` dumps every thread's stack, in every mode (the supervising parent above
    # forwards it instead); onto stderr until the job dir is known.
    stack_dumps.set_folder(None)
    stack_dumps.install_signal_handler()
    if program.target_from_options:
      targets.arrange_cpu_devices(options.cpu_devices())
    try:
      with outputs.stdout_failures():
        code = _run_mode(program, options, cache, list(argv))
        _flush_stdout()
    finally:
      stack_dumps.set_folder(None)  # A process that runs on (tests) has no job dir now.
  except UsageError as e:
    _fail(str(e))
  except (programs.ProgramFailure, DataError, OutputFailure, distributed.StartupFailure) as e:
    _fail(str(e), code=1)
  except outputs.StdoutWriteError as e:
    # Whatever a program prints (a config, a list, a summary) may meet a reader that went away
    # (`| head`) or a full disk (`> /dev/full`): one line and exit 1, in every mode, not a
    # traceback.
    _fail(outputs.failed_write(f"the output of --mode={_MODE.value} to stdout", e,
                               "run it again", to_stdout=True), code=1)
  except Exception as e:  # pylint: disable=broad-except
    # A peer of a multi-process run that died mid-collective: the cause in one line, not the
    # traceback of where this process waited for it. The message is matched first: asking
    # JAX for the process count would start its backend after an error that came before it.
    peer_lost = distributed.lost_peer(e)
    if peer_lost and jax.process_count() > 1:
      _fail(peer_lost, code=1)
    raise
  if code:
    sys.exit(code)


def _run_mode(program: programs.Program, options: Any,
              cache: compilation_cache.CompilationCache, argv: list[str]) -> int | None:
  if _EXPERIMENTS_MODULE.value:
    registry.import_modules(_EXPERIMENTS_MODULE.value)
  _refuse_flags(program)
  if not program.needs_config and not program.needs_job_dir:
    return program.main(programs.Invocation(None, None, None, None, options, argv))
  job_dir = paths.resolve(_JOB_LOG_DIR.value, "--job_log_dir") if _JOB_LOG_DIR.value else None
  if job_dir is None and program.needs_job_dir and not _FDL_HELP.value:
    raise UsageError(f"--job_log_dir: required for --mode={program.name}; e.g. "
                     "--job_log_dir=runs/my_run")
  if job_dir is not None and not _FDL_HELP.value:
    job_dirs.check(job_dir, program.job_files, _JOB_LOG_DIR.value)
    if (program.job_files.records_config and not program.job_files.creates
        and not any(f.value for f in (_EXP, _FDL_CONFIG, _FDL_CONFIG_FILE))
        and not job_dir.exists()):
      # Only a config (--exp) makes a new job dir of decode's or eval's worth reading.
      raise UsageError(f"--job_log_dir={_JOB_LOG_DIR.value}: no such folder; give the "
                       "--job_log_dir of a training run (or with --exp=NAME, a new one for "
                       "the experiment's own weights, train.init_from)")
    if program.needs_config:  # A program that only reads the job (report) writes no dumps there.
      stack_dumps.set_folder(job_dir / "stacks")
  if not program.needs_config:
    # It reads the job's files only (report): nothing is built and no device is touched, so
    # it runs on any machine, beside a trainer that holds the accelerators.
    return program.main(programs.Invocation(None, job_dir, _JOB_LOG_DIR.value, None, options,
                                            argv))
  if program.joins_distributed and not _FDL_HELP.value:
    joined = distributed.initialize(
        _DISTRIBUTED.value, _COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value,
        _PROCESS_ID.value, _HEARTBEAT_TIMEOUT.value, _INIT_TIMEOUT.value)
    if joined and jax.process_index() == 0:
      print(f"jax.distributed: {joined}; {jax.process_count()} processes, "
            f"{jax.device_count()} devices", flush=True)
  cfg, experiment = base_config(job_dir)
  _set_option_parts(cfg, options)
  overrides.apply(cfg, _OVERRIDES.directives, experiment)
  if _FDL_HELP.value:
    print(config_help.describe(cfg, overrides.fiddlers_for(experiment)), end="")
    return None
  target = options.target() if program.target_from_options else targets.host()
  building.spread_over_slices(cfg, target.num_slices)
  with targets.active(target):  # Batch sizes per device and validation count its devices.
    setup = build(cfg)
    if job_dir is not None and program.job_files.depend_on_config:
      # Only the built config says whether the run writes a profiler trace, and the names of the
      # eval sets' files; still nothing is written.
      job_dirs.check(job_dir, program.job_files, _JOB_LOG_DIR.value,
                     profile=setup.train.profile_start_step >= 0,
                     eval_sets=tuple(setup.eval_sets))
    cache.configure()
    invocation = programs.Invocation(
        setup=setup, job_dir=job_dir, shown_job_dir=_JOB_LOG_DIR.value, target=target,
        options=options, command_line=argv, config_text=lambda: config_files.to_text(cfg),
        config_json=lambda: config_files.to_json(cfg, experiment),
        config_svg=lambda: config_graph.svg(cfg),
        write_config=lambda: config_files.write(job_dir, cfg, experiment),
        config_changes=lambda: _config_changes(job_dir, cfg), cache_folder=cache.folder)
    return program.main(invocation)


def _set_option_parts(cfg: fdl.Buildable, options: Any) -> None:
  """Sets the config parts a program's options stand for (`Options.config_parts(cfg)`:
  train's --init_from is `train.init_from`, and a Hugging Face source's `model`), before the
  fiddlers and --fdl overrides, which then change them like any other part; config.json
  records them. `cfg` is a Setup's config (base_config checked it), which may not set every
  part yet: the options may set it (a Hugging Face folder's `model`)."""
  parts = getattr(options, "config_parts", None)
  building.set_parts(cfg, parts(cfg) if parts else {})


def run_main() -> None:
  """Console-script entry point. A process joining a multi-process run is run as the child
  of a supervisor, which turns JAX's abort on a dead peer into one line."""
  supervisor.follow_parent()
  app.run(main, flags_parser=parse_flags)
