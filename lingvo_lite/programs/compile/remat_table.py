"""Which remat policies fit: the step compiled once per policy, at the configured batch.

`--compile_remat_policies=none,full,...` (or `all`: every policy the target takes) needs no
other flag: the report gains a table with, per policy, the bytes per device its verdict
compares, FITS or DOES NOT FIT, the margin and the compile time. A real model's step takes
XLA minutes per policy, so the table is asked for, never compiled by default (the plain report
names the flag). The config's own policy is the report's own compile, not made again; the
report's verdict and exit code stay that policy's: the table says what to change to. With
`--compile_find_max_batch`, each policy's search (max_batch.py) starts from its compile here,
and the table gains its largest per-device batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lingvo_lite import target as targets
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup
from lingvo_lite.models import remat
from lingvo_lite.programs.compile import aot, compile_report
from lingvo_lite.runtime import progress

FLAG = "--compile_remat_policies"


def check_policies(names: list[str], platform: str) -> list[str]:
  """The policies `--compile_remat_policies` names, in order, once each; "all" stands for
  every policy the target's platform takes (host offload where there is a host apart from
  the device)."""
  valid = (*remat.POLICIES, "all")
  chosen = []
  for name in names:
    if name not in valid:
      raise UsageError(f"{FLAG}={','.join(names)}: unknown policy {name!r}; "
                       f"valid: {', '.join(valid)}")
    chosen += ([p for p in remat.POLICIES if platform != "cpu" or not remat.offloads(p)]
               if name == "all" else [name])
  return list(dict.fromkeys(chosen))


def with_policy(setup: Setup, policy: str) -> Setup:
  """`setup` with the model's remat policy `policy` (`setup` itself where it has it)."""
  if policy == setup.model.remat_policy:
    return setup
  return dataclasses.replace(setup, model=setup.model.clone(remat_policy=policy))


def check_setups(setup: Setup, target: targets.Target, policies: list[str]) -> None:
  """Every policy's setup validated for `target` before any compile: a policy the target
  cannot run is one line now, not after the others' minutes of compiling."""
  with targets.active(target):
    for policy in policies:
      try:
        with_policy(setup, policy).validate(target)
      except UsageError as e:
        raise UsageError(f"{FLAG}: policy {policy!r}: {e}") from None


def compile_each(setup: Setup, target: targets.Target, program: str, policies: list[str],
                 first: aot.CompileResult) -> dict[str, aot.CompileResult]:
  """{policy: its step compiled at the configured batch}; the config's own is `first`."""
  compiled = {}
  # A compile can take minutes: after the first seconds, a line per compile made.
  compiling = progress.Progress(
      "remat policies", total=sum(p != setup.model.remat_policy for p in policies),
      unit="compiles", interval=0)
  with compiling:
    for policy in policies:
      if policy == setup.model.remat_policy:
        compiled[policy] = first
        continue
      compiled[policy] = aot.compile_step(with_policy(setup, policy), target, program)
      row = _row(policy, compile_report.build(compiled[policy]))
      compiling.update(1, f"{policy}: {compile_report.gib(row['bytes'])}, {row['verdict']}")
  return compiled


def build(compiled: dict[str, aot.CompileResult]) -> dict[str, Any]:
  """The report's `remat_policies` section: one row per policy, in the order given."""
  reports = {policy: compile_report.build(result) for policy, result in compiled.items()}
  batch = next(iter(reports.values()))["batch"]
  return {"per_device_batch_size": batch["per_device_batch_size"],
          "rows": [_row(policy, report) for policy, report in reports.items()]}


def _row(policy: str, report: dict[str, Any]) -> dict[str, Any]:
  return {"remat_policy": policy, "description": remat.POLICIES[policy].description,
          "bytes": report["memory"]["deciding"], "available": report["memory"]["available"],
          "verdict": report["verdict"], "margin": report["margin"],
          "compile_seconds": report["compile_seconds"],
          "compile_cached": report["compile_cached"]}
