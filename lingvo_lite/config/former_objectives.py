"""`train.objective` as lingvo_lite spelled it before objectives were config parts.

Until then `train.objective` was a name, 'lm' or 'dpo', and DPO's settings were a part of their
own, `train.dpo` (a `DpoSettings`, now the `Dpo` objective itself: config/moved_modules.py's
`MOVED_NAMES`). Now `train.objective` is the objective's part (training/objectives/):
`fdl.Config(Dpo, beta=0.1)`, or `--fiddler=dpo`.

- A config.json written then is read as the objective it named (`upgrade`, which
  config/files.py calls after the module paths are migrated): the name becomes the part, with
  `train.dpo`'s settings as its fields; settings of an objective the job did not train with
  (a `train.dpo` beside 'lm') were never read and are dropped. Each field keeps the origin
  config.txt recorded (`train.dpo.beta`'s is `train.objective.beta`'s now).
- The command line refuses the old spellings in one line that names the new one
  (`refusal`): `--fdl.train.objective='dpo'` (-> `--fiddler=dpo`), `--fdl.train.dpo.beta=0.2`
  (-> `--fiddler=dpo --fdl.train.objective.beta=0.2`). They are not translated: an objective is
  code the config points at (DESIGN rule 1), not a name looked up.

The former names are each objective class's own `former_name`; only the two objectives that
had one are listed here, since no objective added later was ever spelled so.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import fiddle as fdl
from fiddle import history

from lingvo_lite.experiment import TrainLoop
from lingvo_lite.training.objectives.dpo import Dpo
from lingvo_lite.training.objectives.lm import LanguageModelling

_FORMER = {kind.former_name: kind for kind in (LanguageModelling, Dpo)}
# The TrainLoop fields that held an objective's settings: named as the objective was.
_SETTINGS_FIELDS = {name: kind for name, kind in _FORMER.items() if dataclasses.fields(kind)}
_DEFAULT = type(TrainLoop().objective)
_WHERE = "config.json written before objectives were config parts"


def _train_loop(cfg: Any) -> fdl.Buildable | None:
  """The config's `train` part, where it is a TrainLoop's config."""
  train = cfg.__arguments__.get("train") if isinstance(cfg, fdl.Buildable) else None
  if not isinstance(train, fdl.Buildable):
    return None
  fn = fdl.get_callable(train)
  return train if isinstance(fn, type) and issubclass(fn, TrainLoop) else None


def holds_train_loop(cfg: Any) -> bool:
  """Whether `cfg`'s `train` is a TrainLoop (its config, or its default): the part whose
  fields changed."""
  train = getattr(cfg, "train", None) if isinstance(cfg, fdl.Buildable) else None
  kind = fdl.get_callable(train) if isinstance(train, fdl.Buildable) else type(train)
  return isinstance(kind, type) and issubclass(kind, TrainLoop)


def upgrade(cfg: Any, origins: dict[str, Any] | None = None) -> list[str]:
  """Rewrites, in place, a loaded config.json's former `train.objective` name and
  `train.dpo` settings as the objective's part, moving their recorded `origins` (config.json's
  path -> origin entries) along; returns `old -> new` for what it rewrote."""
  train = _train_loop(cfg)
  if train is None:
    return []
  arguments = train.__arguments__
  name = arguments.get("objective")
  held = {field: arguments[field] for field in _SETTINGS_FIELDS if field in arguments}
  if not isinstance(name, str) and not held:
    return []
  if isinstance(name, str) and name not in _FORMER:
    return []  # Not a name that ever was: the type check names it.
  # The objective trained: the one named, the default where none is, else a part already.
  kind = _FORMER[name] if isinstance(name, str) else _DEFAULT if name is None else None
  said = [f"train.objective={name!r}"] if isinstance(name, str) else []
  settings = None
  for field, value in held.items():
    said.append(f"train.{field}")
    delattr(train, field)
    if (_SETTINGS_FIELDS[field] is kind and isinstance(value, fdl.Buildable)
        and fdl.get_callable(value) is kind):
      settings = value
      _move_origins(origins, f"train.{field}", "train.objective")
    else:
      _move_origins(origins, f"train.{field}", None)  # Never read: dropped.
  if isinstance(name, str) or settings is not None:
    new = settings if settings is not None else fdl.Config(kind)
    with history.custom_location(lambda: history.Location(_WHERE, 0, "upgrade")):
      train.objective = new
    fields = ", ".join(f"{k}={v!r}" for k, v in new.__arguments__.items())
    return [f"{' and '.join(said)} -> train.objective={kind.__name__}({fields})"]
  return [f"{' and '.join(said)} (not read by train.objective) dropped"]


def _move_origins(origins: dict[str, Any] | None, old: str, new: str | None) -> None:
  """Moves the recorded origins of `old` and the fields below it to `new` (None: drops
  them); the objective's own origin (`train.objective`, where it was named) is kept."""
  if origins is None:
    return
  for path in [p for p in origins if p == old or p.startswith(old + ".")]:
    entry = origins.pop(path)
    if new is not None and path != old:
      origins[new + path[len(old):]] = entry


def refusal(steps: Sequence[Any], value: Any) -> str | None:
  """The new spelling of a `--fdl.PATH=VALUE` (`steps`: the path's fields) that sets
  `train.objective` to a former name, or `train.dpo`; None for any other."""
  if len(steps) < 2 or steps[0] != "train":
    return None
  if list(steps) == ["train", "objective"] and isinstance(value, str):
    kind = _FORMER.get(value)
    if kind is None:
      return None  # Never a name: the type check says what the field takes.
    if kind is _DEFAULT:
      return (f"train.objective is a config part now, and {kind.__name__} (the next-token "
              "loss) its default; leave the flag out")
    return (f"train.objective is a config part now, not a name; give --fiddler="
            f"{kind.former_name} ({kind.__module__}.{kind.__name__}), then its fields as "
            f"--fdl.train.objective.FIELD=VALUE")
  kind = _SETTINGS_FIELDS.get(steps[1]) if isinstance(steps[1], str) else None
  if kind is None:
    return None
  rest = "".join(f".{step}" for step in steps[2:]) or ".FIELD"
  return (f"train.{steps[1]} is gone: {kind.__name__}'s settings are train.objective's "
          f"fields now; give --fiddler={kind.former_name} --fdl.train.objective{rest}=VALUE")
