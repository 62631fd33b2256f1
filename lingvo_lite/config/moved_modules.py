"""Modules that moved into packages, and how their old import paths still resolve.

A job's `config.json` names the class or function of every part by import path
(`lingvo_lite.decode_settings.DecodeSettings`), and experiment modules written for an older
lingvo_lite import from the old places (`from lingvo_lite.registry import register`). The
house was rebuilt into packages (`config/`, `decode/`, `report/`, `runtime/`,
`checkpoints/`, `programs/compile/`, then `training/`, with modules renamed where two of
different layers shared a name; then training's running code into `on_mesh/`, its frozen
weights into `weights/` and DPO into `training/objectives/`); `MOVED_MODULES` maps each old
path to the new one, in one step (an entry names where the module is now, never another old
path). A class that moved and was renamed too is in `MOVED_NAMES` (old import path -> new).

- `config.json` is migrated on read (`config/files.py` calls `migrate`), which says so.
- `import lingvo_lite.registry` (any old path that is not also a new package's name) gets
  the new module itself, through `install()`'s import finder, so old user code keeps working
  and a module never exists twice.

Only the standard library here: `lingvo_lite/__init__.py` installs the finder first thing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

MOVED_MODULES = {
    "lingvo_lite.building": "lingvo_lite.config.building",
    "lingvo_lite.builtin_packages": "lingvo_lite.config.builtin_packages",
    "lingvo_lite.checkpoint_errors": "lingvo_lite.checkpoints.orbax_errors",
    "lingvo_lite.checkpoint_health": "lingvo_lite.checkpoints.health",
    "lingvo_lite.checkpoint_integrity": "lingvo_lite.checkpoints.integrity",
    "lingvo_lite.checkpoints": "lingvo_lite.checkpoints.manager",
    "lingvo_lite.checkpoints.errors": "lingvo_lite.checkpoints.orbax_errors",
    "lingvo_lite.compilation_cache": "lingvo_lite.runtime.compilation_cache",
    "lingvo_lite.config.experiment_modules": "lingvo_lite.runtime.user_code",
    "lingvo_lite.config_checks": "lingvo_lite.config.checks",
    "lingvo_lite.config_diffs": "lingvo_lite.config.diffs",
    "lingvo_lite.config_files": "lingvo_lite.config.files",
    "lingvo_lite.config_graph": "lingvo_lite.config.graph",
    "lingvo_lite.config_help": "lingvo_lite.config.help",
    "lingvo_lite.data.tensorflow_import": "lingvo_lite.runtime.tensorflow_import",
    "lingvo_lite.decode_records": "lingvo_lite.decode.records",
    "lingvo_lite.decode_requests": "lingvo_lite.decode.requests",
    "lingvo_lite.decode_settings": "lingvo_lite.decode.settings",
    "lingvo_lite.decode_steps": "lingvo_lite.decode.jitted",
    "lingvo_lite.decoding": "lingvo_lite.decode.steps",
    "lingvo_lite.distributed": "lingvo_lite.runtime.distributed",
    "lingvo_lite.evaluation": "lingvo_lite.on_mesh.evaluation",
    "lingvo_lite.event_files": "lingvo_lite.runtime.event_files",
    "lingvo_lite.experiment_modules": "lingvo_lite.runtime.user_code",
    "lingvo_lite.fiddlers": "lingvo_lite.config.fiddlers",
    "lingvo_lite.generation": "lingvo_lite.decode.generator",
    "lingvo_lite.harness.requests": "lingvo_lite.harness.request_kinds",
    "lingvo_lite.jitted": "lingvo_lite.on_mesh.jitted",
    "lingvo_lite.job_dirs": "lingvo_lite.runtime.job_dirs",
    "lingvo_lite.job_lock": "lingvo_lite.runtime.lock",
    "lingvo_lite.optimizers": "lingvo_lite.training.optimizers",
    "lingvo_lite.overrides": "lingvo_lite.config.overrides",
    "lingvo_lite.programs.aot": "lingvo_lite.programs.compile.aot",
    "lingvo_lite.programs.compile": "lingvo_lite.programs.compile.program",
    "lingvo_lite.programs.compile.decode": "lingvo_lite.programs.compile.decode_compile",
    "lingvo_lite.programs.compile.report": "lingvo_lite.programs.compile.compile_report",
    "lingvo_lite.programs.compile_report": "lingvo_lite.programs.compile.compile_report",
    "lingvo_lite.programs.compiled_steps": "lingvo_lite.programs.compile.compiled_steps",
    "lingvo_lite.programs.decode_compile": "lingvo_lite.programs.compile.decode_compile",
    "lingvo_lite.programs.jitted": "lingvo_lite.on_mesh.jitted",
    "lingvo_lite.programs.max_batch": "lingvo_lite.programs.compile.max_batch",
    "lingvo_lite.programs.stop_request": "lingvo_lite.runtime.stop_request",
    "lingvo_lite.programs.train.outputs": "lingvo_lite.programs.train.run_outputs",
    "lingvo_lite.progress": "lingvo_lite.runtime.progress",
    "lingvo_lite.registry": "lingvo_lite.config.registry",
    "lingvo_lite.report.data": "lingvo_lite.report.job_data",
    "lingvo_lite.report_data": "lingvo_lite.report.job_data",
    "lingvo_lite.report_html": "lingvo_lite.report.html",
    "lingvo_lite.report_plots": "lingvo_lite.report.plots",
    "lingvo_lite.run_info": "lingvo_lite.runtime.run_info",
    "lingvo_lite.sampling": "lingvo_lite.decode.sampling",
    "lingvo_lite.scoring.packing": "lingvo_lite.scoring.row_packing",
    "lingvo_lite.small_disk": "lingvo_lite.runtime.small_disk",
    "lingvo_lite.stack_dumps": "lingvo_lite.runtime.stack_dumps",
    "lingvo_lite.steps": "lingvo_lite.training.steps",
    "lingvo_lite.summaries": "lingvo_lite.runtime.summaries",
    "lingvo_lite.supervisor": "lingvo_lite.runtime.supervisor",
    "lingvo_lite.train_state": "lingvo_lite.training.train_state",
    "lingvo_lite.training.dpo": "lingvo_lite.training.objectives.dpo",
    "lingvo_lite.training.evaluation": "lingvo_lite.on_mesh.evaluation",
    "lingvo_lite.training.frozen_weights": "lingvo_lite.weights.frozen_weights",
    "lingvo_lite.training.jitted": "lingvo_lite.on_mesh.jitted",
    "lingvo_lite.watchdog": "lingvo_lite.runtime.watchdog",
}

# Classes that moved and were renamed: DPO's settings (`train.dpo`) are its objective's fields
# now (config/former_objectives.py reads the configs that held them).
MOVED_NAMES = {
    "lingvo_lite.training.dpo.DpoSettings": "lingvo_lite.training.objectives.dpo.Dpo",
}

# Old module paths that are now packages of their own (`lingvo_lite.checkpoints`): the package
# wins an import, so only `migrate` can read a config.json that names them.
_NOW_PACKAGES = ("lingvo_lite.checkpoints", "lingvo_lite.programs.compile")


class _Alias(importlib.abc.Loader):
  """Loads an old path as the module at its new path (one module object, two names)."""

  def __init__(self, new: str):
    self._new = new

  def create_module(self, spec):
    return importlib.import_module(self._new)

  def exec_module(self, module) -> None:
    pass  # The new module is already executed.


class _MovedModuleFinder(importlib.abc.MetaPathFinder):

  def find_spec(self, fullname, path, target=None):
    new = MOVED_MODULES.get(fullname)
    if new is None or fullname in _NOW_PACKAGES:
      return None
    return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
  """Makes the old import paths resolve (once per process)."""
  if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())


def migrate(data: Any) -> list[str]:
  """Rewrites, in place, every `{"module": OLD, "name": NAME}` reference of a deserialized
  config.json to where it is now (`MOVED_NAMES`, else the module's new path); returns
  `OLD -> NEW` for each path it changed."""
  moved: set[str] = set()

  def walk(value: Any) -> None:
    if isinstance(value, dict):
      module, name = value.get("module"), value.get("name")
      renamed = MOVED_NAMES.get(f"{module}.{name}")
      if isinstance(module, str) and isinstance(name, str) and renamed is not None:
        value["module"], value["name"] = renamed.rsplit(".", 1)
        moved.add(f"{module}.{name} -> {renamed}")
      elif isinstance(module, str) and module in MOVED_MODULES and "name" in value:
        value["module"] = MOVED_MODULES[module]
        moved.add(f"{module} -> {MOVED_MODULES[module]}")
      for item in value.values():
        walk(item)
    elif isinstance(value, list):
      for item in value:
        walk(item)

  walk(data)
  return sorted(moved)
