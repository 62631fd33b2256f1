"""From a config to a validated Setup: type checks, `fdl.build`, then `Setup.validate()`.

What `--exp`, `--fdl_config`, `--fdl_config_file` or a job's config.json gives is checked to be
a config of a `Setup` (`require_setup`) before anything reads a field of it: a program's
options, the fiddlers, the `--fdl` overrides and `--fdl_help` all address the config by its
Setup paths (`model`, `train.init_from`). A config of a model or a data source is one line.

Every program gets its Setup from here, so a config that would fail is refused, with one
line naming the field, before any device time is spent. A constructor that rejects a value
raises `UsageError` naming its own field (`source_dir=...: no such folder`); the config path
of that constructor, which Fiddle appends to the exception, is put in front of it. Any other
exception from a constructor is a bug, not the user's mistake: it keeps its traceback.

On several TPU slices a config that spreads no axis across them is spread over the data axis
(`spread_over_slices`), before it is built.
"""

from __future__ import annotations

import re
from typing import Any

import fiddle as fdl

from lingvo_lite import fields, partitioning
from lingvo_lite.config import checks as config_checks
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup, is_setup_class, with_default_parts

# What fiddle 0.3 appends to an exception raised by the constructor at a config path.
_FIDDLE_CONTEXT = re.compile(r"\n\nFiddle context: failed to construct or call .*? at "
                             r"<root>(\S*) with ", re.DOTALL)
# The start of a `config_error` message: `field=value: ...`.
_FIELD_FIRST = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*|\[\d+\])*=")

# The fix for a flag that names a config, and for a config file (--fdl_config_file, a job's).
FIX_FLAG = ("name an experiment (see --mode=list), or a function returning a Setup's config "
            "(lingvo_lite.experiment.setup_config(model=..., optimizer=..., train_data=...))")
FIX_FILE = "give a config.json that a lingvo_lite run wrote (a Setup's config)"


def require_setup(cfg: Any, where: str, fix: str = FIX_FLAG) -> fdl.Config:
  """`cfg` if it is a config of a `Setup` or of a subclass of it (experiment.is_setup_class),
  with the default parts it leaves out (experiment.with_default_parts).

  The root must be `fdl.Config(Setup, ...)` itself, not a function that makes one: the
  programs, fiddlers and overrides reach its parts by their paths in a Setup. Which parts
  must be set (model, optimizer, train_data, eval_data) is checked by `build`, after the
  options, fiddlers and overrides that may set them.

  Args:
    cfg: What the flag or the config.json gave.
    where: The flag and its value, as the message names them (`--exp=NAME`).
    fix: What to give instead (FIX_FLAG, FIX_FILE).

  Raises:
    UsageError: one line naming `where` and what the config builds instead.
  """
  if not isinstance(cfg, fdl.Buildable):
    raise UsageError(f"{where}: gives a {type(cfg).__name__}, not a config; {fix}")
  fn = fdl.get_callable(cfg)
  if not isinstance(cfg, fdl.Config):
    raise UsageError(f"{where}: the config is a fdl.{type(cfg).__name__} of {_name(fn)}, "
                     f"which builds a function, not a lingvo_lite Setup; {fix}")
  if not isinstance(fn, type):
    raise UsageError(f"{where}: the config calls {_name(fn)}(), not a lingvo_lite Setup "
                     "itself (the programs and --fdl overrides reach a Setup's parts by "
                     f"their paths, so the config must be fdl.Config(Setup, ...)); {fix}")
  if not is_setup_class(fn):
    raise UsageError(f"{where}: the config builds a {_name(fn)}, not a lingvo_lite Setup"
                     f"{_held_by(cfg)}; {fix}")
  return with_default_parts(cfg)


def _name(fn: Any) -> str:
  return getattr(fn, "__qualname__", None) or type(fn).__name__


def _held_by(cfg: fdl.Config) -> str:
  """` (what a Setup's model holds)` for a config that fits one of Setup's fields."""
  for name, annotation in fields.type_hints(Setup).items():
    if fields.is_part(annotation) and fields.matches(
        cfg, annotation, config_checks.built_type) is True:
      return f" (a {_name(fdl.get_callable(cfg))} is what a Setup's {name} holds)"
  return ""


def set_parts(cfg: fdl.Buildable, parts: dict[str, Any]) -> None:
  """Sets each `{dotted path: part}` in `cfg` (`train.init_from`, `model`): what a program's
  options stand for (--init_from), set before the fiddlers and --fdl overrides."""
  for path, part in parts.items():
    *owners, name = path.split(".")
    owner = cfg
    for step in owners:
      owner = getattr(owner, step)
    setattr(owner, name, part)


def build(cfg: fdl.Buildable) -> Setup:
  """Checks, builds and validates `cfg`.

  Raises:
    UsageError: one line naming the config path, for a value the type checks, a
      constructor or `Setup.validate()` refuses.
  """
  config_checks.check(cfg)
  try:
    setup = fdl.build(cfg)
  except UsageError as e:
    raise UsageError(_with_config_path(e)) from None
  if not isinstance(setup, Setup):
    raise UsageError(f"the config builds a {type(setup).__name__}, not a lingvo_lite Setup")
  setup.validate()
  return setup


def _with_config_path(error: UsageError) -> str:
  """The constructor's own message, led by the config path of the failing constructor."""
  message = str(getattr(error, "proxy_base_exception", error)).strip()
  context = _FIDDLE_CONTEXT.search(str(error))
  # Fiddle writes a mapping's entry as ['key']: the dotted spelling is the one users type.
  path = re.sub(r"\['([A-Za-z_]\w*)'\]", r".\1", context.group(1)).lstrip(".") if context else ""
  if not path:
    return message
  return f"{path}.{message}" if _FIELD_FIRST.match(message) else f"{path}: {message}"


def spread_over_slices(cfg: fdl.Buildable, num_slices: int) -> None:
  """On several TPU slices, a config that sets no axis across slices gets
  `partitioner.dcn_data` = the slice count (data parallel over the data-center network, as
  MaxText's default)."""
  partitioner = getattr(cfg, "partitioner", None)
  if num_slices > 1 and isinstance(partitioner, fdl.Config) and all(
      getattr(partitioner, f"dcn_{axis}", 1) == 1 for axis in partitioning.MESH_AXES):
    partitioner.dcn_data = num_slices
