"""The command-line executor: the only module that defines flags.

  python -m lingvo_lite --exp=PyCodeTiny --mode=train --job_log_dir=runs/tiny \\
      --fiddler=tiny --fdl.model.num_layers=2 --fdl.train.steps=50

Flow: flags -> base config (an experiment, a config function, or a config.json) ->
fiddlers and `--fdl.path=value` overrides in command-line order -> `fdl.build` ->
`Setup.validate()` -> the program of `--mode`. Mistakes in the command or the config end
with one line on stderr and exit code 2 before any device time is spent.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Sequence

from absl import app, flags, logging

import fiddle as fdl
import jax
from etils import epath

from lingvo_lite import (building, config_files, distributed, overrides, paths, registry,
                         supervisor)
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
flags.DEFINE_multi_string(
    "fiddler", [], "Named config mutation (experiment's, its module's, or generic: tiny, "
    "synthetic_data, no_eval). Applied in command-line order with --fdl.* sets.")
flags.DEFINE_multi_string(
    "fdl_set", [], "PATH=VALUE override, same as --fdl.PATH=VALUE; VALUE is a Python literal.")
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

# Overrides in command-line order, filled by parse_flags (absl cannot keep their order).
_directives: list[overrides.Directive] = []


def _fail(message: str, code: int = 2) -> None:
  print(f"lingvo_lite: error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl flags_parser: pulls out ordered overrides, parses the rest, one-line errors."""
  global _directives
  try:
    remaining, _directives = overrides.extract(argv)
    positional = flags.FLAGS(remaining)
  except flags.Error as e:
    _fail(str(e).splitlines()[0])
  except UsageError as e:
    _fail(str(e))
  if len(positional) > 1:
    _fail(f"unexpected argument {positional[1]!r}; flags take the form --name=value")
  return positional


# ----------------------------------------------------------------------------- configs


def base_config(job_dir: epath.Path | None) -> tuple[fdl.Buildable, type | None]:
  """The config named by --exp, --fdl_config or --fdl_config_file, else JOB/config.json."""
  given = [(f"--{flag.name}", flag.value) for flag in (_EXP, _FDL_CONFIG, _FDL_CONFIG_FILE)
           if flag.value]
  if len(given) > 1:
    raise UsageError(f"{' and '.join(f'{k}={v}' for k, v in given)}: conflicting flags; "
                     "give only one of --exp, --fdl_config, --fdl_config_file")
  if given:
    flag, value = given[0]
    if flag == "--fdl_config_file":
      return config_files.load(paths.resolve(value)), None
    return registry.config_from_flag(flag, value)
  if job_dir is not None and (job_dir / config_files.CONFIG_JSON).exists():
    return config_files.load(job_dir / config_files.CONFIG_JSON, "--job_log_dir"), None
  where = f" and {job_dir} holds no {config_files.CONFIG_JSON}" if job_dir else ""
  raise UsageError(f"--exp: no experiment given{where}; pass --exp=NAME (see --mode=list), "
                   "--fdl_config_file=PATH, or a --job_log_dir of an earlier run")


build = building.build


def build_experiment(name: str, assignments: Sequence[str] = ()) -> Setup:
  """The registered experiment `name` with `PATH=VALUE` assignments applied in order (as
  --fdl_set applies them), built and validated: for scripts that take no lingvo_lite flags."""
  cfg = registry.lookup(name).config()
  overrides.apply(cfg, [overrides.set_directive(f"--set {a}", a) for a in assignments], None)
  return build(cfg)


# ----------------------------------------------------------------------------- modes


def _list_experiments() -> None:
  for name, cls in registry.all_experiments().items():
    doc = (inspect.getdoc(cls) or "").splitlines()
    print(f"{name:<40} {doc[0] if doc else ''}")


def _check_resume(job_dir: epath.Path, cfg: fdl.Buildable) -> None:
  """Refuses to train into a job dir whose config differs in what shapes the state."""
  existing = job_dir / config_files.CONFIG_JSON
  if not existing.exists():
    return
  changes = config_files.incompatible_changes(config_files.load(existing, "--job_log_dir"),
                                              cfg)
  if changes:
    shown = "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3
                                      else "")
    raise UsageError(f"--job_log_dir={job_dir}: the config differs from the one this job "
                     f"was trained with ({shown}); resume with the same config or use a new "
                     "--job_log_dir")


def _train(setup: Setup, cfg: fdl.Buildable, job_dir: epath.Path) -> None:
  from lingvo_lite.programs import train  # pylint: disable=g-import-not-at-top
  _check_resume(job_dir, cfg)

  def record_config() -> None:
    if jax.process_index() == 0:
      config_files.write(job_dir, cfg)
  try:
    result = train.run(setup, job_dir, record_config)
  except train.TrainingFailure as e:
    _fail(str(e), code=1)
  if jax.process_index() != 0:
    return
  lines = [f"done: step {result.step}" + (" (stopped by signal)" if result.interrupted else "")]
  if result.train_loss is not None:
    lines.append(f"  final train loss: {result.train_loss:.4f}")
  if result.eval_metrics:
    lines.append(f"  final eval loss:  {result.eval_metrics['loss']:.4f} "
                 f"({result.eval_metrics['bits_per_token']:.4f} bits/token)")
  lines += [f"  config:      {job_dir / config_files.CONFIG_TXT} (reload: "
            f"--fdl_config_file={job_dir / config_files.CONFIG_JSON})",
            f"  checkpoints: {job_dir / 'checkpoints'}",
            f"  metrics:     {job_dir / 'metrics.jsonl'}, {job_dir / 'eval_metrics.jsonl'}",
            f"  TensorBoard: tensorboard --logdir={job_dir / 'summaries'}"]
  print("\n".join(lines), flush=True)


def _configure_compilation_cache() -> None:
  if _COMPILATION_CACHE_DIR.value:
    jax.config.update("jax_compilation_cache_dir", _COMPILATION_CACHE_DIR.value)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def main(argv: Sequence[str]) -> None:
  del argv
  if not flags.FLAGS["verbosity"].present:
    # orbax and jax log every checkpoint step at INFO; -v 0 brings them back.
    logging.set_verbosity(logging.WARNING)
  try:
    _run_mode()
  except UsageError as e:
    _fail(str(e))


def _run_mode() -> None:
  mode = _MODE.value
  if mode == "list":
    _list_experiments()
    return
  job_dir = paths.resolve(_JOB_LOG_DIR.value) if _JOB_LOG_DIR.value else None
  if job_dir is None and mode in ("train", "eval"):
    raise UsageError(f"--job_log_dir: required for --mode={mode}; e.g. "
                     "--job_log_dir=runs/my_run")
  if mode in ("train", "eval"):
    joined = distributed.initialize(
        _DISTRIBUTED.value, _COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value,
        _PROCESS_ID.value, _HEARTBEAT_TIMEOUT.value)
    if joined and jax.process_index() == 0:
      print(f"jax.distributed: {joined}; {jax.process_count()} processes, "
            f"{jax.device_count()} devices", flush=True)
  cfg, experiment = base_config(job_dir)
  overrides.apply(cfg, _directives, experiment)
  if mode == "print":
    print(config_files.to_text(cfg), end="")
    return
  setup = build(cfg)
  _configure_compilation_cache()
  if mode == "train":
    _train(setup, cfg, job_dir)
  elif mode == "eval":
    from lingvo_lite.programs import eval as eval_program  # pylint: disable=g-import-not-at-top
    eval_program.run(setup, job_dir)


def run_main() -> None:
  """Console-script entry point. A process joining a multi-process run is run as the child
  of a supervisor, which turns JAX's abort on a dead peer into one line."""
  if supervisor.wanted(sys.argv):
    sys.exit(supervisor.supervise(sys.argv[1:]))
  supervisor.follow_parent()
  app.run(main, flags_parser=parse_flags)
