"""A run's config on disk: `config.json` to rebuild it, `config.txt` to read it.

`config.txt` lists every field, flattened (`model.num_layers = 2`), with where its value
came from: the experiment's source line, a command-line flag, or `default`. Configs held in
a dict, list or tuple are listed under the path a `--fdl.` flag reaches them by
(`eval_data.held_out.num_batches = 8`, `train_data.sources[0].split = 'train'`), below one
line for the container (`eval_data = {held_out, validation}`). `config.json`
is Fiddle's serialization plus a `lingvo_lite` entry (which Fiddle's loader ignores) holding
each field's origin and the experiment's name: `--fdl_config_file=JOB/config.json` rebuilds
an equal config whose `config.txt` still says where every value came from, and whose
experiment's own fiddlers still apply.

Longer than 300 lines with a reason: writing a config (config.txt's rows with their origins,
config.json with the lingvo_lite entry) and reading it back (origins restored, the resume
check of what may change) are one format, kept in one place so that the two cannot drift.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Iterator

import fiddle as fdl
import flax.linen as nn
from etils import epath
from fiddle import history
from fiddle.experimental import serialization

from lingvo_lite import file_writes, input_files, paths
from lingvo_lite.config import former_objectives, moved_modules
from lingvo_lite.errors import UsageError
from lingvo_lite.fields import entries, key_text, path_join

CONFIG_JSON = "config.json"
CONFIG_TXT = "config.txt"
_EXTRA_KEY = "lingvo_lite"  # Our entry in config.json, beside Fiddle's own keys.
# config.json's format, in our entry: 2 since model families' defaults may change (a family's
# `former_defaults`); a file without it is older, and its model gets the defaults it had.
CONFIG_FORMAT = 2
# The config.json files whose migration to moved module paths was said, once per process
# (a program reads its job's config more than once).
_MIGRATION_SAID: set[str] = set()

# What a resumed run may change: loop length and logging, checkpoint cadence, the mesh, the
# model fields its family names resumable (`resumable_fields`: how layers and attention are
# executed; a checkpoint's layer layout is converted on restore), and the optimizer's
# hyperparameters, which leave its state's tree as it is (the way back from a divergence is
# a lower learning rate or clipping), and where its state is kept between steps (device or host
# memory: the same arrays). Everything else (the model, the optimizer's kind and its moments'
# dtype, the training data) shapes the state or the data a step sees.
RESUMABLE_SECTIONS = (
    "train.", "checkpoint.", "partitioner.", "eval_data.", "decode.", "watchdog.",
    "optimizer.peak_learning_rate", "optimizer.warmup_steps", "optimizer.decay_steps",
    "optimizer.final_learning_rate_ratio", "optimizer.b1", "optimizer.b2", "optimizer.eps",
    "optimizer.weight_decay", "optimizer.clip_grad_norm", "optimizer.offload_state")


def _last_location(buildable: fdl.Buildable, name: str) -> history.Location | None:
  entries = buildable.__argument_history__.get(name, [])
  return entries[-1].location if entries else None


def _origin(buildable: fdl.Buildable, name: str) -> str:
  location = _last_location(buildable, name)
  if location is None:
    return "default"
  if location.filename == "command line":
    return f"command line: {location.function_name}"
  if location.line_number == 0:  # A file the value was read from (a weight source's config).
    return location.filename
  filename = location.filename
  if os.path.isabs(filename):
    try:
      filename = os.path.relpath(filename)
    except ValueError:
      pass
  return f"{filename}:{location.line_number}"


def _callable_name(buildable: fdl.Buildable) -> str:
  fn = fdl.get_callable(buildable)
  return f"{fn.__module__}.{fn.__qualname__}"


def _arguments(buildable: fdl.Buildable) -> dict[str, Any]:
  arguments = fdl.ordered_arguments(buildable, include_defaults=True)
  fn = fdl.get_callable(buildable)
  if isinstance(fn, type) and issubclass(fn, nn.Module):
    # Flax's bookkeeping fields, not settings.
    arguments = {k: v for k, v in arguments.items() if k not in ("parent", "name")}
  return arguments


@dataclasses.dataclass(frozen=True)
class Row:
  """One line of the listing: a config's field, or an entry of a container of configs.

  Attributes:
    path: As a `--fdl.` flag writes it: `model.dim`, `eval_data.held_out`, `sources[0]`.
    owner: The config the field belongs to, or the dict, list or tuple holding the entry.
    key: The field's name, or the entry's key or index.
    value: What the field or entry holds.
    text: The value as config.txt shows it.
    origin: Where it was set: of the field, or of the field holding the container.
  """

  path: str
  owner: Any
  key: Any
  value: Any
  text: str
  origin: str


def _holds_configs(value: Any) -> bool:
  """Whether a dict, list or tuple holds a config at any depth (a plain one is a literal)."""
  return any(isinstance(entry, fdl.Buildable) or _holds_configs(entry)
             for _, entry in entries(value))


def _text(value: Any) -> str:
  if isinstance(value, fdl.Buildable):
    return f"<{_callable_name(value)}>"
  if _holds_configs(value):
    # Its entries get lines of their own; this one says where to find them.
    if isinstance(value, dict):
      return "{" + ", ".join(key_text(key) for key in value) + "}"
    return f"<{type(value).__name__} of {len(value)} items>"
  return repr(value)


def _rows(value: Any, path: str, origin: str) -> Iterator[Row]:
  """The rows below `value` (a config, or a container of configs) at `path`."""
  if isinstance(value, fdl.Buildable):
    for name, child in _arguments(value).items():
      child_path, child_origin = path_join(path, name), _origin(value, name)
      yield Row(child_path, value, name, child, _text(child), child_origin)
      yield from _rows(child, child_path, child_origin)
  elif _holds_configs(value):
    for key, child in entries(value):
      child_path = path_join(path, key)
      yield Row(child_path, value, key, child, _text(child), origin)
      yield from _rows(child, child_path, origin)


def rows(cfg: Any) -> Iterator[Row]:
  """Every field of the config tree, defaults included, depth first."""
  if isinstance(cfg, fdl.Buildable):
    yield from _rows(cfg, "", "")


def fields(cfg: Any) -> Iterator[tuple[str, Any, Any, Any]]:
  """(path, owner, field name or key, value) for every row, depth first."""
  for row in rows(cfg):
    yield row.path, row.owner, row.key, row.value


def flatten(cfg: Any) -> Iterator[tuple[str, str, str]]:
  """(path, value as shown, origin) for every row, defaults included, depth first."""
  for row in rows(cfg):
    yield row.path, row.text, row.origin


def to_text(cfg: fdl.Buildable) -> str:
  """The flattened listing written to config.txt and printed by --mode=print."""
  listing = [("<root>", f"<{_callable_name(cfg)}>", "")] + list(flatten(cfg))
  width = min(max(len(f"{path} = {value}") for path, value, _ in listing), 64)
  lines = []
  for path, value, origin in listing:
    assignment = f"{path} = {value}"
    lines.append(f"{assignment:<{width}}  # {origin}" if origin else assignment)
  return "\n".join(lines) + "\n"


def to_json(cfg: fdl.Buildable, experiment: type | None = None) -> str:
  """Fiddle's JSON of `cfg`, plus each explicitly set field's origin and the experiment."""
  data = input_files.json_value(serialization.dump_json(cfg))
  origins = {}
  for path, owner, name, _ in fields(cfg):
    if not isinstance(owner, fdl.Buildable):
      continue  # An entry of a container: its origin is the field holding the container.
    location = _last_location(owner, name)
    if location is not None:
      origins[path] = [location.filename, location.line_number, location.function_name]
  data[_EXTRA_KEY] = {
      "format": CONFIG_FORMAT,
      "experiment": f"{experiment.__module__}.{experiment.__qualname__}" if experiment else None,
      "origins": origins,
  }
  return json.dumps(data, indent=2)


def _restore_origins(cfg: fdl.Buildable, origins: dict[str, Any]) -> None:
  """Re-records each field's origin in the reloaded config's history."""
  for path, owner, name, value in list(fields(cfg)):
    recorded = origins.get(path)
    # Only a config's own fields have a history; an entry of a container has none.
    if not recorded or not isinstance(owner, fdl.Buildable) or name not in owner.__arguments__:
      continue
    try:
      filename, line_number, function_name = recorded
      location = history.Location(filename=str(filename), line_number=int(line_number),
                                  function_name=function_name)
    except Exception:  # pylint: disable=broad-except
      continue  # A damaged origin ('abc', 1e999): this field's is lost, the others stay.
    with history.custom_location(lambda location=location: location):
      setattr(owner, name, value)


def _read_json(path: epath.Path, flag: str) -> dict[str, Any]:
  if not path.exists():
    raise UsageError(f"{flag}={path}: no such file")
  if path.is_dir():
    raise UsageError(f"{flag}={path}: is a folder; give the config.json file in it, e.g. "
                     f"{flag}={path / CONFIG_JSON}")
  try:
    data = input_files.json_value(input_files.read_bytes(path, f"{flag}={path}",
                                             "give the config.json a run wrote"))
  # RecursionError: arrays nested thousands deep.
  except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
    raise UsageError(f"{flag}={path}: not a config.json written by lingvo_lite "
                     f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
  if not isinstance(data, dict):
    raise UsageError(f"{flag}={path}: not a config.json written by lingvo_lite (it holds a "
                     f"JSON {type(data).__name__}, not an object)")
  return data


def load(path: epath.Path, flag: str = "--fdl_config_file") -> fdl.Buildable:
  """Reads a config.json, with each field's origin; a bad file is a one-line usage error."""
  data = _read_json(path, flag)
  try:
    moved = moved_modules.migrate(data)
    if moved and str(path) not in _MIGRATION_SAID:
      _MIGRATION_SAID.add(str(path))
      print(f"lingvo_lite: note: {path} was written before its modules moved into packages; "
            f"read with the new paths ({'; '.join(moved)})", file=sys.stderr, flush=True)
    cfg = serialization.load_json(json.dumps(data))
  # A config.json is user data, and loading it imports the modules it names: whatever that
  # raises (a module with a syntax error or that fails at import, a reference Fiddle's policy
  # refuses such as `os.system`, nesting deeper than the stack) is the file's problem.
  except (Exception, SystemExit) as e:  # pylint: disable=broad-except
    raise UsageError(f"{flag}={path}: not a config.json written by lingvo_lite, or it names "
                     f"code that no longer exists ({_first_line(e)})") from None
  if not isinstance(cfg, fdl.Buildable):
    raise UsageError(f"{flag}={path}: holds a {type(cfg).__name__}, not a config")
  extra = data.get(_EXTRA_KEY)
  origins = extra.get("origins") if isinstance(extra, dict) else None
  upgraded = former_objectives.upgrade(cfg, origins if isinstance(origins, dict) else None)
  if upgraded and f"objective {path}" not in _MIGRATION_SAID:
    _MIGRATION_SAID.add(f"objective {path}")
    print(f"lingvo_lite: note: {path} was written when train.objective was a name; read as "
          f"its part ({'; '.join(upgraded)})", file=sys.stderr, flush=True)
  if not (isinstance(extra, dict) and extra.get("format") == CONFIG_FORMAT):
    kept = _keep_former_defaults(cfg)
    if kept and f"defaults {path}" not in _MIGRATION_SAID:
      _MIGRATION_SAID.add(f"defaults {path}")
      print(f"lingvo_lite: note: {path} was written before some model defaults changed; read "
            f"with the defaults it was written with ({', '.join(kept)})", file=sys.stderr,
            flush=True)
  if isinstance(extra, dict) and isinstance(extra.get("origins"), dict):
    try:
      _restore_origins(cfg, extra["origins"])
    # Origins are for reading config.txt; a config with damaged ones (a line number of
    # 1e999 is an OverflowError) still runs.
    except Exception:  # pylint: disable=broad-except
      pass
  return cfg


def _keep_former_defaults(cfg: fdl.Buildable) -> list[str]:
  """Sets on the config's model each field its family's default has changed for since the file
  was written (`former_defaults`) and the file does not set; returns them as `model.x=v`."""
  family = _model_family(cfg)
  if family is None or not hasattr(family, "former_defaults"):
    return []
  model = cfg.model
  kept = []
  for name, value in family.former_defaults(dict(model.__arguments__)).items():
    if name not in model.__arguments__:
      with history.custom_location(lambda: history.Location(
          "config.json written before these defaults changed", 0, "former_defaults")):
        setattr(model, name, value)
      kept.append(f"model.{name}={value!r}")
  return kept


def _first_line(error: BaseException) -> str:
  """`Type: the message's first line`, at most 200 characters of it."""
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__


def recorded_experiment(path: epath.Path) -> str | None:
  """The import path of the experiment class a config.json was written from, if recorded."""
  try:
    extra = input_files.json_value(input_files.read_bytes(path, str(path))).get(_EXTRA_KEY) or {}
  except (OSError, ValueError, AttributeError):
    return None
  name = extra.get("experiment") if isinstance(extra, dict) else None
  return name if isinstance(name, str) else None


def write(job_dir: epath.Path, cfg: fdl.Buildable, experiment: type | None = None) -> None:
  """Writes config.json and config.txt, each through a temporary file and a rename.

  Raises:
    OSError: naming the file that could not be written (a full disk); no temporary file is
      left, and that file is as it was.
  """
  with file_writes.writing(job_dir):
    job_dir.mkdir(parents=True, exist_ok=True)
  for name, text in ((CONFIG_JSON, to_json(cfg, experiment)), (CONFIG_TXT, to_text(cfg))):
    with file_writes.writing(job_dir / name):
      paths.write_atomically(job_dir / name, text)


def _model_family(cfg: fdl.Buildable) -> Any:
  """The class of the config's model (a family, models/family.py), or None."""
  model = getattr(cfg, "model", None) if isinstance(cfg, fdl.Buildable) else None
  return fdl.get_callable(model) if isinstance(model, fdl.Buildable) else None


def _resumable_sections(cfg: fdl.Buildable) -> tuple[str, ...]:
  """RESUMABLE_SECTIONS and the model fields the config's family lets a resumed run change."""
  family = _model_family(cfg)
  return RESUMABLE_SECTIONS + tuple(f"model.{name}" for name in
                                    getattr(family, "resumable_fields", ()))


def _same_model_class(previous: fdl.Buildable, current: fdl.Buildable) -> bool:
  """Whether the two configs' model classes build one model from equal fields: equal, or one
  names the other in `same_model_as` (a family class whose fields came from the one an older
  job's config.json names). Their fields are compared one by one all the same."""
  old, new = _model_family(previous), _model_family(current)
  if old is None or new is None:
    return False
  old_name = f"{old.__module__}.{old.__qualname__}"
  new_name = f"{new.__module__}.{new.__qualname__}"
  return (old is new or old_name in getattr(new, "same_model_as", ())
          or new_name in getattr(old, "same_model_as", ()))


def incompatible_changes(previous: fdl.Buildable, current: fdl.Buildable) -> list[str]:
  """Fields outside the resumable sections whose values differ, as `path: old -> new`."""
  old = {path: value for path, value, _ in flatten(previous)}
  new = {path: value for path, value, _ in flatten(current)}
  sections = _resumable_sections(current)
  same_model_class = _same_model_class(previous, current)
  changes = []
  for path in sorted(set(old) | set(new)):
    resumable = any(path == section.rstrip(".") or path.startswith(section)
                    for section in sections)
    if path == "model" and same_model_class:
      continue
    if old.get(path) != new.get(path) and not resumable:
      changes.append(f"{path}: {old.get(path, '<absent>')} -> {new.get(path, '<absent>')}")
  return changes
