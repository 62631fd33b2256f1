"""Which settings fit: the step compiled once per choice of a setting, at the configured batch.

Two settings are tabulated, each asked for by a flag that needs no other:
`--compile_remat_policies=none,full,...` (the model's remat policy: models/remat.py) and
`--compile_optimizer_options=bfloat16,offload,...` (how Adam's moments are kept: their dtype
and whether they live in host memory between steps, `optimizer.moment_dtype` and
`optimizer.offload_state`). `all` stands for every choice the target takes (host offload only
where there is a host apart from the device). The report gains a table per setting with, per
choice, the bytes per device its verdict compares, the bytes it keeps in host memory, FITS or
DOES NOT FIT, the margin and the compile time. A real model's step takes XLA minutes per
choice, so a table is asked for, never compiled by default (the plain report names the flags).
The config's own choice is the report's own compile, not made again; the report's verdict and
exit code stay the config's: a table says what to change to. With `--compile_find_max_batch`,
each choice's search (max_batch.py) starts from its compile here, and the table gains its
largest per-device batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from lingvo_lite import target as targets
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup
from lingvo_lite.models import remat
from lingvo_lite.programs.compile import aot, compile_report
from lingvo_lite.runtime import progress


@dataclasses.dataclass(frozen=True)
class Table:
  """One setting the compile program tabulates.

  Attributes:
    flag: The flag that asks for it.
    key: The report's section of it ("remat_policies").
    column: The field that names a row's choice ("remat_policy").
    title: A choice in words, its plural, and the short noun of messages ("remat policy",
      "remat policies", "policy").
    choices: Name -> description, in the table's order.
    offloads: Whether a choice keeps something in host memory (not on a CPU target).
    apply: The setup with a choice made.
    own: The config's own choice, or None where it is none of them.
  """

  flag: str
  key: str
  column: str
  title: tuple[str, str, str]
  choices: dict[str, str]
  offloads: Callable[[str], bool]
  apply: Callable[[Setup, str], Setup]
  own: Callable[[Setup], str | None]

  def check_names(self, names: list[str], platform: str) -> list[str]:
    """The choices the flag names, in order, once each ("all": every one the target's
    platform takes)."""
    valid = (*self.choices, "all")
    chosen = []
    for name in names:
      if name not in valid:
        raise UsageError(f"{self.flag}={','.join(names)}: unknown {self.title[2]} {name!r}; "
                         f"valid: {', '.join(valid)}")
      chosen += ([c for c in self.choices if platform != "cpu" or not self.offloads(c)]
                 if name == "all" else [name])
    return list(dict.fromkeys(chosen))

  def check_setups(self, setup: Setup, target: targets.Target, names: list[str]) -> None:
    """Every choice's setup validated for `target` before any compile: one the target cannot
    run is one line now, not after the others' minutes of compiling."""
    with targets.active(target):
      for name in names:
        try:
          self.apply(setup, name).validate(target)
        except UsageError as e:
          raise UsageError(f"{self.flag}: {self.title[2]} {name!r}: {e}") from None

  def compile_each(self, setup: Setup, target: targets.Target, program: str,
                   names: list[str], first: aot.CompileResult
                   ) -> dict[str, aot.CompileResult]:
    """{choice: its step compiled at the configured batch}; the config's own is `first`."""
    own = self.own(setup)
    compiled = {}
    # A compile can take minutes: after the first seconds, a line per compile made.
    compiling = progress.Progress(self.title[1], total=sum(n != own for n in names),
                                  unit="compiles", interval=0)
    with compiling:
      for name in names:
        if name == own:
          compiled[name] = first
          continue
        compiled[name] = aot.compile_step(self.apply(setup, name), target, program)
        row = self._row(name, compile_report.build(compiled[name]))
        compiling.update(1, f"{name}: {compile_report.gib(row['bytes'])}, {row['verdict']}")
    return compiled

  def build(self, setup: Setup, compiled: dict[str, aot.CompileResult]) -> dict[str, Any]:
    """The report's section of this table: one row per choice, in the order given."""
    reports = {name: compile_report.build(result) for name, result in compiled.items()}
    batch = next(iter(reports.values()))["batch"]
    return {"column": self.column, "title": self.title[0], "heading": self.title[1],
            "own": self.own(setup), "per_device_batch_size": batch["per_device_batch_size"],
            "rows": [self._row(name, report) for name, report in reports.items()]}

  def _row(self, name: str, report: dict[str, Any]) -> dict[str, Any]:
    memory = report["memory"]
    host = memory.get("host") or {}
    return {self.column: name, "description": self.choices[name],
            "bytes": memory["deciding"], "available": memory["available"],
            "host_bytes": (host.get("arguments", 0) + host.get("outputs", 0)
                           - host.get("aliased", 0) + host.get("temporaries", 0)),
            "verdict": report["verdict"], "margin": report["margin"],
            "compile_seconds": report["compile_seconds"],
            "compile_cached": report["compile_cached"]}


def _with_policy(setup: Setup, policy: str) -> Setup:
  if policy == setup.model.remat_policy:
    return setup
  return dataclasses.replace(setup, model=setup.model.clone(remat_policy=policy))


REMAT = Table(
    flag="--compile_remat_policies", key="remat_policies", column="remat_policy",
    title=("remat policy", "remat policies", "policy"),
    choices={name: policy.description for name, policy in remat.POLICIES.items()},
    offloads=remat.offloads, apply=_with_policy, own=lambda setup: setup.model.remat_policy)


@dataclasses.dataclass(frozen=True)
class OptimizerOption:
  """A way to keep the optimizer's moments: `optimizer.moment_dtype` and `.offload_state`."""

  moment_dtype: str | None
  offload_state: bool
  description: str


OPTIMIZER_OPTIONS = {
    "param_dtype": OptimizerOption(None, False, "Adam's moments in the parameters' dtype, on "
                                   "the device (AdamW's default)"),
    "bfloat16": OptimizerOption("bfloat16", False, "the moments in bfloat16, on the device"),
    "offload": OptimizerOption(None, True, "the moments in the parameters' dtype, in host "
                               "memory between steps"),
    "bfloat16_offload": OptimizerOption("bfloat16", True, "the moments in bfloat16, in host "
                                        "memory between steps"),
}


def _with_option(setup: Setup, name: str) -> Setup:
  option = OPTIMIZER_OPTIONS[name]
  if not all(hasattr(setup.optimizer, f) for f in ("moment_dtype", "offload_state")):
    raise UsageError(f"the optimizer, a {type(setup.optimizer).__name__}, has no moment_dtype "
                     "and offload_state to set; drop the flag")
  optimizer = dataclasses.replace(setup.optimizer, moment_dtype=option.moment_dtype,
                                  offload_state=option.offload_state)
  return setup if optimizer == setup.optimizer else dataclasses.replace(setup,
                                                                        optimizer=optimizer)


def _own_option(setup: Setup) -> str | None:
  kept = (getattr(setup.optimizer, "moment_dtype", None),
          getattr(setup.optimizer, "offload_state", False))
  return next((name for name, option in OPTIMIZER_OPTIONS.items()
               if (option.moment_dtype, option.offload_state) == kept), None)


OPTIMIZER = Table(
    flag="--compile_optimizer_options", key="optimizer_options", column="optimizer_option",
    title=("optimizer option", "optimizer options", "option"),
    choices={name: option.description for name, option in OPTIMIZER_OPTIONS.items()},
    offloads=lambda name: OPTIMIZER_OPTIONS[name].offload_state, apply=_with_option,
    own=_own_option)

TABLES = (REMAT, OPTIMIZER)
