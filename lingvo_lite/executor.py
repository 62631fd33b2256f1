"""The command-line executor: the only module that defines flags.

  python -m lingvo_lite --exp=PyCodeTiny --mode=train --job_log_dir=runs/tiny \\
      --fiddler=tiny --fdl.model.num_layers=2 --fdl.train.steps=50

Flow: flags -> base config (an experiment, a config function, or a config.json) ->
fiddlers and `--fdl.path=value` overrides in command-line order -> `fdl.build` ->
`Setup.validate()` -> the program of `--mode`. Mistakes in the command or the config end
with one line on stderr and exit code 2 before any device time is spent.
"""

from __future__ import annotations

import importlib
import inspect
import logging as std_logging
import os
import sys
from typing import Sequence

from absl import app, flags, logging

import fiddle as fdl
import jax
from etils import epath

from lingvo_lite import (building, command_line, config_files, config_help, distributed, job_dirs,
                         job_lock, overrides, paths, registry, supervisor)
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup

MODES = ("train", "eval", "print", "list")
_DEFAULT_CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "lingvo_lite", "jax")

_EXP = flags.DEFINE_string(
    "exp", None, "Registered experiment: full name (lm.pycode.PyCodeTiny), a unique dotted "
    "suffix (PyCodeTiny) or an import path.")
_FDL_CONFIG = flags.DEFINE_string(
    "fdl_config", None, "Like --exp; also a function returning a config, with literal "
    "arguments: 'module.fn(layers=4)'.")
_FDL_CONFIG_FILE = flags.DEFINE_string(
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
_EXPERIMENTS_MODULE = flags.DEFINE_list(
    "experiments_module", [], "Modules to import before looking experiments up, e.g. "
    "my_project.experiments (comma-separated); their @register classes join --mode=list.")
_FDL_HELP = flags.DEFINE_bool(
    "fdl_help", False, "Lists every field of the chosen config (type, value, origin, doc) "
    "and the fiddlers that apply, then exits.")
_MODE = flags.DEFINE_enum("mode", "train", MODES, "Program to run.")
_JOB_LOG_DIR = flags.DEFINE_string(
    "job_log_dir", None, "Job folder: config, checkpoints, metrics, summaries (local or "
    "remote path).")
_COMPILATION_CACHE_DIR = flags.DEFINE_string(
    "compilation_cache_dir", _DEFAULT_CACHE,
    "Persistent JAX compilation cache, so a restarted run skips compiling; '' disables it.")

_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ("auto", "on", "off"),
    "Multi-process runs through jax.distributed: auto = when --coordinator_address is given "
    "or a SLURM / Open MPI / TPU pod environment is detected.")
_COORDINATOR_ADDRESS = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0, which hosts the coordinator.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, from 0.")
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "heartbeat_timeout_seconds", 100,
    "A process silent for this long counts as dead and every process stops (JAX's default).")

def override_log() -> command_line.OverrideLog:
  """The overrides of the parsed command line, in order (for tests and tools)."""
  return _OVERRIDES


def _fail(message: str, code: int = 2) -> None:
  """Prints the one error line and exits. Messages quote what the user typed, which can hold
  a newline or another control character (`--exp=$'a\\nb'`); escaped as Python would write
  them, they keep the message on the one line the contract promises."""
  message = "".join(ch if ch.isprintable() or ch == " " else
                    ch.encode("unicode_escape").decode("ascii") for ch in message)
  print(f"lingvo_lite: error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl flags_parser: expands flag files, answers --help, parses; one-line errors."""
  try:
    args = command_line.expand(argv, flags.FLAGS)
    wanted_help = command_line.help_requested(args)
    if wanted_help:
      _print_help(wanted_help)
      sys.exit(0)
    positional = flags.FLAGS(args)
  except (flags.Error, ValueError) as e:
    _fail(str(e).splitlines()[0])
  except UsageError as e:
    _fail(str(e))
  if len(positional) > 1:
    _fail(f"unexpected argument {positional[1]!r}; flags take the form --name=value")
  return positional


def _print_help(kind: str) -> None:
  """--help: this module's flags; --helpfull: every flag (absl's own handlers exit 1)."""
  if kind == "xml":
    flags.FLAGS.write_help_in_xml_format(sys.stdout)
    return
  print(__doc__.strip() + "\n")
  if kind == "full":
    print(flags.FLAGS.get_help())
  else:
    print("Flags:\n" + flags.FLAGS.module_help(sys.modules[__name__]).split("\n", 1)[1])
    print("\n--fdl_help lists the fields and fiddlers of a config; --helpfull lists every flag.")


# ----------------------------------------------------------------------------- configs


def base_config(job_dir: epath.Path | None) -> tuple[fdl.Buildable, type | None]:
  """The config named by --exp, --fdl_config or --fdl_config_file, else JOB/config.json,
  and the experiment class it came from (None for a config function)."""
  given = [(f"--{flag.name}", flag.value) for flag in (_EXP, _FDL_CONFIG, _FDL_CONFIG_FILE)
           if flag.value]
  if len(given) > 1:
    raise UsageError(f"{' and '.join(f'{k}={v}' for k, v in given)}: conflicting flags; "
                     "give only one of --exp, --fdl_config, --fdl_config_file")
  if given and given[0][0] != "--fdl_config_file":
    return registry.config_from_flag(*given[0])
  if given:
    flag, path = given[0][0], paths.resolve(given[0][1], given[0][0])
  elif job_dir is not None and (job_dir / config_files.CONFIG_JSON).exists():
    flag, path = "--job_log_dir", job_dir / config_files.CONFIG_JSON
  else:
    where = f" and {job_dir} holds no {config_files.CONFIG_JSON}" if job_dir else ""
    raise UsageError(f"--exp: no experiment given{where}; pass --exp=NAME (see --mode=list), "
                     "--fdl_config_file=PATH, or a --job_log_dir of an earlier run")
  cfg = config_files.load(path, flag)
  # The experiment's own fiddlers still apply to its reloaded config, if it still exists.
  recorded = config_files.recorded_experiment(path)
  return cfg, _recorded_class(recorded) if recorded else None


def _recorded_class(name: str) -> type | None:
  """The class at import path `name`, or None if it is gone (the config still runs)."""
  module_name, _, attribute = name.rpartition(".")
  try:
    found = getattr(importlib.import_module(module_name), attribute, None)
  except Exception:  # pylint: disable=broad-except
    return None
  return found if inspect.isclass(found) else None


build = building.build


def build_experiment(name: str, assignments: Sequence[str] = ()) -> Setup:
  """The registered experiment `name` with `PATH=VALUE` assignments applied in order (as
  --fdl_set applies them), built and validated: for scripts that take no lingvo_lite flags."""
  cfg = registry.lookup(name).config()
  overrides.apply(cfg, [overrides.set_directive(f"--set {a}", a) for a in assignments], None)
  return build(cfg)


# ----------------------------------------------------------------------------- modes


def _list_experiments() -> None:
  """Every registered experiment; a module that failed to import is one warning line each,
  and the rest are still listed."""
  for name, cls in registry.all_experiments().items():
    doc = (inspect.getdoc(cls) or "").splitlines()
    print(f"{name:<40} {doc[0] if doc else ''}")
  for module, reason in registry.import_failures().items():
    print(f"lingvo_lite: warning: skipped {module}: {reason}", file=sys.stderr)


# What only a mode with a config uses; --mode=list refuses them rather than ignore them.
_CONFIG_FLAGS = ("exp", "fdl_config", "fdl_config_file", "fiddler", "fdl_set",
                 command_line.DOTTED_FLAG, "fdl_help", "job_log_dir")


def _refuse_config_flags(mode: str) -> None:
  for name in _CONFIG_FLAGS:
    if flags.FLAGS[name].present:
      shown = "--fdl.PATH=VALUE" if name == command_line.DOTTED_FLAG else f"--{name}"
      raise UsageError(f"{shown}: --mode={mode} takes no config or job dir (it lists every "
                       "registered experiment); drop the flag, or pick another --mode")


def _check_resume(job_dir: epath.Path, cfg: fdl.Buildable) -> None:
  """Refuses to train into a job dir whose config differs in what shapes the state."""
  existing = job_dir / config_files.CONFIG_JSON
  if not existing.exists():
    return
  changes = config_files.incompatible_changes(config_files.load(existing, "--job_log_dir"),
                                              cfg)
  if changes:
    raise UsageError(f"--job_log_dir={job_dir}: the config differs from the one this job "
                     f"was trained with ({_summarize(changes)}); resume with the same config "
                     "or use a new --job_log_dir")


def _check_eval_model(job_dir: epath.Path, cfg: fdl.Buildable) -> None:
  """Eval of a job's checkpoints with another model config would score another model, even
  when the shapes agree (another norm, activation or rotary setting)."""
  existing = job_dir / config_files.CONFIG_JSON
  if not existing.exists():
    return
  changes = [c for c in config_files.incompatible_changes(
      config_files.load(existing, "--job_log_dir"), cfg) if c.startswith("model.")]
  if changes:
    raise UsageError(f"--job_log_dir={job_dir}: the model config differs from the one its "
                     f"checkpoints were trained with ({_summarize(changes)}); evaluate with "
                     "the job's own config (drop the --exp and model overrides)")


def _summarize(changes: Sequence[str]) -> str:
  return "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3
                                   else "")


def _train(setup: Setup, cfg: fdl.Buildable, experiment: type | None,
           job_dir: epath.Path) -> None:
  from lingvo_lite.programs import train  # pylint: disable=g-import-not-at-top

  def record_config() -> None:
    if jax.process_index() == 0:
      config_files.write(job_dir, cfg, experiment)
  setup.check_data()  # An empty data source is one line now, not a failure mid-run.
  # The lock first: what the job holds (its config, its checkpoints) is read under it.
  lock = job_lock.JobLock(job_dir, enabled=jax.process_index() == 0, shown=_JOB_LOG_DIR.value)
  try:
    with lock:
      _check_resume(job_dir, cfg)
      job_is_new = not (job_dir / config_files.CONFIG_JSON).exists()
      result = train.run(setup, job_dir, record_config, job_is_new)
  except train.TrainingFailure as e:
    _fail(str(e), code=1)
  if jax.process_index() != 0:
    return
  shown = epath.Path(_JOB_LOG_DIR.value)  # As the user wrote it (relative stays relative).
  lines = [f"done: step {result.step}" + (" (stopped by signal)" if result.interrupted else "")]
  if result.train_loss is not None:
    lines.append(f"  final train loss: {result.train_loss:.4f}")
  if result.eval_metrics:
    lines.append(f"  final eval loss:  {result.eval_metrics['loss']:.4f} "
                 f"({result.eval_metrics['bits_per_token']:.4f} bits/token)")
  lines += [f"  config:      {shown / config_files.CONFIG_TXT} (reload: "
            f"--fdl_config_file={shown / config_files.CONFIG_JSON})",
            f"  checkpoints: {shown / 'checkpoints'}",
            f"  metrics:     {shown / 'metrics.jsonl'}, {shown / 'eval_metrics.jsonl'}",
            f"  TensorBoard: tensorboard --logdir={shown / 'summaries'}"]
  print("\n".join(lines), flush=True)


def _configure_compilation_cache() -> None:
  if _COMPILATION_CACHE_DIR.value:
    jax.config.update("jax_compilation_cache_dir", _COMPILATION_CACHE_DIR.value)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _quiet_orbax(record: std_logging.LogRecord) -> bool:
  """Drops orbax's own warnings and errors: lingvo_lite reports what they are about (a failed
  save, an incomplete step) in one line of its own, where orbax logs hundreds of lines of
  tracebacks from its background threads. `--verbosity` (`-v 0`) shows them again."""
  return f"{os.sep}orbax{os.sep}" not in record.pathname


def main(argv: Sequence[str]) -> None:
  del argv
  if not flags.FLAGS["verbosity"].present:
    # orbax and jax log every checkpoint step at INFO; -v 0 brings them back.
    logging.set_verbosity(logging.WARNING)
    logging.get_absl_handler().addFilter(_quiet_orbax)
  try:
    if _MODE.value in ("train", "eval"):
      distributed.plan(_DISTRIBUTED.value, _COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value,
                       _PROCESS_ID.value)  # Flags that cannot work fail before a child starts.
      if supervisor.wanted(_DISTRIBUTED.value, _COORDINATOR_ADDRESS.value):
        sys.exit(supervisor.supervise(sys.argv[1:]))
    _run_mode()
  except UsageError as e:
    _fail(str(e))


def _run_mode() -> None:
  mode = _MODE.value
  if _EXPERIMENTS_MODULE.value:
    registry.import_modules(_EXPERIMENTS_MODULE.value)
  if mode == "list":
    _refuse_config_flags(mode)
    _list_experiments()
    return
  job_dir = paths.resolve(_JOB_LOG_DIR.value, "--job_log_dir") if _JOB_LOG_DIR.value else None
  if job_dir is None and mode in ("train", "eval") and not _FDL_HELP.value:
    raise UsageError(f"--job_log_dir: required for --mode={mode}; e.g. "
                     "--job_log_dir=runs/my_run")
  if job_dir is not None and not _FDL_HELP.value:
    job_dirs.check(job_dir, mode, _JOB_LOG_DIR.value)
  if mode in ("train", "eval") and not _FDL_HELP.value:
    joined = distributed.initialize(
        _DISTRIBUTED.value, _COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value,
        _PROCESS_ID.value, _HEARTBEAT_TIMEOUT.value)
    if joined and jax.process_index() == 0:
      print(f"jax.distributed: {joined}; {jax.process_count()} processes, "
            f"{jax.device_count()} devices", flush=True)
  cfg, experiment = base_config(job_dir)
  overrides.apply(cfg, _OVERRIDES.directives, experiment)
  if _FDL_HELP.value:
    print(config_help.describe(cfg, overrides.fiddlers_for(experiment)), end="")
    return
  setup = build(cfg)
  if mode == "train" and setup.train.profile_start_step >= 0:
    # Only the built config says whether the run writes JOB/profile; still nothing is written.
    job_dirs.check(job_dir, mode, _JOB_LOG_DIR.value, profile=True)
  if mode == "print":
    print(config_files.to_text(cfg), end="")
    return
  _configure_compilation_cache()
  if mode == "train":
    _train(setup, cfg, experiment, job_dir)
  elif mode == "eval":
    from lingvo_lite.programs import eval as eval_program  # pylint: disable=g-import-not-at-top
    _check_eval_model(job_dir, cfg)
    setup.check_data(("eval_data",))
    eval_program.run(setup, job_dir)


def run_main() -> None:
  """Console-script entry point. A process joining a multi-process run is run as the child
  of a supervisor, which turns JAX's abort on a dead peer into one line."""
  supervisor.follow_parent()
  app.run(main, flags_parser=parse_flags)
