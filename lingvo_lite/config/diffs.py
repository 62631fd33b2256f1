"""A job's config as the run report shows it: every field with its origin, marked where it
differs from its experiment's defaults, and the differences between jobs' configs.

The defaults are the recorded experiment's own `config()` (config.json names its class), so
the marked fields are what the command line and fiddlers changed. Differences between jobs
come from Fiddle's diffing (`fiddle.diffing.build_diff`, which aligns the two config graphs,
so a part that moved or was replaced is one change), shown as the flattened fields of
config.txt below each changed path. A config edge: it imports Fiddle, so that the report
program does not.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import fiddle as fdl
from etils import epath
from fiddle import daglish, diffing

from lingvo_lite.config import building, files as config_files, registry
from lingvo_lite.experiment import with_default_parts
from lingvo_lite.fields import path_join

ABSENT = "<absent>"  # A field one config has and the other does not.


@dataclasses.dataclass(frozen=True)
class Field:
  """One row of the config table.

  Attributes:
    path: As a `--fdl.` flag writes it (`model.num_layers`).
    value: As config.txt shows it.
    origin: Where it was set (a source line, a flag, or `default`).
    default: The experiment's own value, where it differs (ABSENT where the experiment's
      config has no such field); None where it is the same or there are no defaults.
  """

  path: str
  value: str
  origin: str
  default: str | None = None

  @property
  def changed(self) -> bool:
    return self.default is not None


@dataclasses.dataclass(frozen=True)
class JobConfig:
  """A job's config, loaded, and its rows.

  Attributes:
    cfg: The config (a fdl.Buildable), as the executor would load it.
    experiment: The experiment class's import path config.json records, if any.
    fields: Every field, depth first, as config.txt lists them.
    defaults_note: Why no field is compared with defaults (None: they were compared).
  """

  cfg: Any
  experiment: str | None
  fields: list[Field]
  defaults_note: str | None

  @property
  def changed(self) -> list[Field]:
    return [field for field in self.fields if field.changed]

  @property
  def objective(self) -> Any:
    """The class of the job's `train.objective` (training/objectives/), or None where the
    config holds none that can be told (the report then draws the known objectives' plots)."""
    train = getattr(self.cfg, "train", None)
    objective = getattr(train, "objective", None) if isinstance(train, fdl.Buildable) else None
    return fdl.get_callable(objective) if isinstance(objective, fdl.Buildable) else (
        None if objective is None else type(objective))


def load(job_dir: epath.Path, flag: str) -> tuple[Any, str | None]:
  """JOB/config.json as the executor loads it (a Setup's, with the parts a newer Setup added),
  and the recorded experiment's import path. A bad file, or one whose config is not a Setup's
  (building.require_setup), is a one-line UsageError naming `flag`."""
  path = job_dir / config_files.CONFIG_JSON
  cfg = building.require_setup(config_files.load(path, flag), f"{flag}={path}",
                               building.FIX_FILE)
  return cfg, config_files.recorded_experiment(path)


def _defaults(experiment: str | None) -> tuple[dict[str, str] | None, str | None]:
  """(path -> value text of the experiment's own config, None) or (None, why not)."""
  if not experiment:
    return None, ("config.json names no experiment class (a config function's run, or an "
                  "older job): nothing to compare with")
  found, error = registry.recorded_class(experiment)
  if found is not None and not callable(getattr(found, "config", None)):
    found = None
  if found is not None:
    try:
      cfg = with_default_parts(found.config())
    # The experiment is user code, and may be broken since the run.
    except Exception as e:  # pylint: disable=broad-except
      error = e
    else:
      return {path: value for path, value, _ in config_files.flatten(cfg)}, None
  if error is None:
    return None, f"{experiment} is no longer an experiment class here: no defaults shown"
  return None, (f"{experiment} cannot be imported or configured here ({type(error).__name__}: "
                f"{str(error).splitlines()[0][:200] if str(error) else ''}): no defaults shown")


def job_config(job_dir: epath.Path, flag: str) -> JobConfig:
  """The job's config with each field compared with its experiment's defaults."""
  cfg, experiment = load(job_dir, flag)
  defaults, note = _defaults(experiment)
  fields = []
  for path, value, origin in config_files.flatten(cfg):
    default = None
    if defaults is not None and defaults.get(path, ABSENT) != value:
      default = defaults.get(path, ABSENT)
    fields.append(Field(path, value, origin, default))
  return JobConfig(cfg, experiment, fields, note)


# ----------------------------------------------------------------------------- between jobs


def _path_text(path: daglish.Path) -> str:
  """A daglish path as config.txt writes it; it stops at an element that is not a field,
  key or index (a changed callable), which the config it belongs to stands for."""
  text = ""
  for element in path:
    if isinstance(element, daglish.Attr):
      text = path_join(text, element.name)
    elif isinstance(element, daglish.Key):
      text = path_join(text, element.key)
    elif isinstance(element, daglish.Index):
      text = path_join(text, element.index)
    else:
      break
  return text


def _below(path: str, changed: str) -> bool:
  return (not changed or path == changed or path.startswith(changed + ".")
          or path.startswith(changed + "["))


def differences(configs: Sequence[Any]) -> list[tuple[str, list[str]]]:
  """The fields where `configs[1:]` differ from `configs[0]`: (path, each config's value).

  Fiddle's diff of the first config against each other one names the changed paths; below
  each, the flattened fields whose values differ are listed, in config.txt's order.
  """
  changed: set[str] = set()
  for other in configs[1:]:
    for change in diffing.build_diff(configs[0], other).changes:
      changed.add(_path_text(change.target))
  listings = [{path: value for path, value, _ in config_files.flatten(cfg)} for cfg in configs]
  order = list(dict.fromkeys(path for listing in listings for path in listing))
  rows = []
  for path in order:
    values = [listing.get(path, ABSENT) for listing in listings]
    if len(set(values)) > 1 and any(_below(path, c) for c in changed):
      rows.append((path, values))
  return rows
