"""A run's config on disk: `config.json` to rebuild it, `config.txt` to read it.

`config.txt` lists every field, flattened (`model.num_layers = 2`), with where its value
came from: the experiment's source line, a command-line flag, or `default`. `config.json`
is Fiddle's serialization; `--fdl_config_file=JOB/config.json` rebuilds an equal config.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

import fiddle as fdl
import flax.linen as nn
from etils import epath
from fiddle.experimental import serialization

from lingvo_lite.errors import UsageError

CONFIG_JSON = "config.json"
CONFIG_TXT = "config.txt"

# What a resumed run may change: loop length and logging, checkpoint cadence, the mesh, and
# how layers and attention are executed (a checkpoint's layer layout is converted on
# restore; the attention implementations compute the same function). Everything else (model,
# optimizer, data) shapes the state or the loss curve.
RESUMABLE_SECTIONS = ("train.", "checkpoint.", "partitioner.", "eval_data.",
                      "model.scan_layers", "model.remat_policy", "model.attention_implementation")


def _origin(buildable: fdl.Buildable, name: str) -> str:
  entries = buildable.__argument_history__.get(name, [])
  if not entries:
    return "default"
  location = entries[-1].location
  if location.filename == "command line":
    return f"command line: {location.function_name}"
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


def flatten(cfg: Any, prefix: str = "") -> Iterator[tuple[str, str, str]]:
  """(path, value repr, origin) for every field, defaults included, depth first."""
  if not isinstance(cfg, fdl.Buildable):
    return
  arguments = fdl.ordered_arguments(cfg, include_defaults=True)
  fn = fdl.get_callable(cfg)
  if isinstance(fn, type) and issubclass(fn, nn.Module):
    # Flax's bookkeeping fields, not settings.
    arguments = {k: v for k, v in arguments.items() if k not in ("parent", "name")}
  for name, value in arguments.items():
    path = f"{prefix}{name}"
    if isinstance(value, fdl.Buildable):
      yield path, f"<{_callable_name(value)}>", _origin(cfg, name)
      yield from flatten(value, path + ".")
    else:
      yield path, repr(value), _origin(cfg, name)


def to_text(cfg: fdl.Buildable) -> str:
  """The flattened listing written to config.txt and printed by --mode=print."""
  rows = [("<root>", f"<{_callable_name(cfg)}>", "")] + list(flatten(cfg))
  width = min(max(len(f"{path} = {value}") for path, value, _ in rows), 64)
  lines = []
  for path, value, origin in rows:
    assignment = f"{path} = {value}"
    lines.append(f"{assignment:<{width}}  # {origin}" if origin else assignment)
  return "\n".join(lines) + "\n"


def to_json(cfg: fdl.Buildable) -> str:
  return serialization.dump_json(cfg, indent=2)


def load(path: epath.Path, flag: str = "--fdl_config_file") -> fdl.Buildable:
  """Reads a config.json; a missing or unreadable file is a one-line usage error."""
  if not path.exists():
    raise UsageError(f"{flag}={path}: no such file")
  try:
    cfg = serialization.load_json(path.read_text())
  except (ValueError, KeyError, TypeError, AttributeError, ModuleNotFoundError,
          json.JSONDecodeError) as e:
    raise UsageError(f"{flag}={path}: not a config.json written by lingvo_lite "
                     f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
  if not isinstance(cfg, fdl.Buildable):
    raise UsageError(f"{flag}={path}: holds a {type(cfg).__name__}, not a config")
  return cfg


def write(job_dir: epath.Path, cfg: fdl.Buildable) -> None:
  """Writes config.json and config.txt, each through a temporary file and a rename."""
  job_dir.mkdir(parents=True, exist_ok=True)
  for name, text in ((CONFIG_JSON, to_json(cfg)), (CONFIG_TXT, to_text(cfg))):
    temporary = job_dir / f".{name}.tmp"
    temporary.write_text(text)
    temporary.replace(job_dir / name)


def incompatible_changes(previous: fdl.Buildable, current: fdl.Buildable) -> list[str]:
  """Fields outside RESUMABLE_SECTIONS whose values differ, as `path: old -> new`."""
  old = {path: value for path, value, _ in flatten(previous)}
  new = {path: value for path, value, _ in flatten(current)}
  changes = []
  for path in sorted(set(old) | set(new)):
    resumable = any(path == section.rstrip(".") or path.startswith(section)
                    for section in RESUMABLE_SECTIONS)
    if old.get(path) != new.get(path) and not resumable:
      changes.append(f"{path}: {old.get(path, '<absent>')} -> {new.get(path, '<absent>')}")
  return changes
