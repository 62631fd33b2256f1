"""The compile report: a verdict, XLA's bytes beside the analytic ones, FLOPs and step time.

Written as JOB/compile/report.json (schema below, read by later programs and the run report)
and JOB/compile/report.txt (the same, for people). All byte counts are per device.

report.json, schema "lingvo_lite.compile_report/1":
  target:     name, platform, device_kind, num_devices, num_processes, num_slices,
              memory_per_device (bytes or null), memory_source
  program:    "train" or "eval";  mesh: {axis: size};  parameters: count;
              remat_policy (the model's)
              (the decode program's report: programs/compile/decode_compile.py)
  batch:      global_batch_size, per_device_batch_size, sequence_length
  memory:     arguments, outputs, aliased, temporaries, generated_code, total (arguments +
              outputs - aliased + temporaries + generated code), peak (XLA's peak of live
              buffers where it reports one; it decides only on TPU), device_allocated
              (what XLA's buffer assignment allocates in the device's memory, or null:
              programs/compile/buffer_assignment.py; it decides on TPU where the program
              keeps temporaries in host memory, which XLA:TPU's peak counts), host:
              {arguments, outputs, aliased, temporaries} (in host memory:
              optimizer.offload_state, a remat policy's offloaded activations),
              deciding (the number the verdict compares), deciding_rule (which and why),
              source: "memory_analysis" | "resource_exhausted" | "none"
  verdict:    "FITS" | "DOES NOT FIT" | "UNKNOWN" (XLA reported no memory analysis)
  margin:     bytes (available - deciding, negative when it does not fit), fraction
  next_knob:  for a step that does not fit, one line naming the field to change first
              (programs/compile/fit_advice.py); null otherwise
  largest_buffers: [{bytes, shape, instruction, op_name, memory_space}]: the ten largest
              in the device's memory, then the three largest elsewhere (5: host memory)
  analytic:   by_part: parameters, optimizer (by moment name), other_state, batch; total, and
              xla_arguments beside it; host_by_part, host_total, xla_host_arguments: the
              same of what lives in host memory (an offloaded optimizer state)
  flops:      xla_per_device, model_per_step, model_per_device
  compile_seconds, compile_cached (the analyses are an earlier compile's of the same program,
              read from the compilation cache: programs/compile/analyses.py; compile_seconds is
              that compile's)
  pipeline:   null without a stage axis; else the schedule, its bubble fraction and formula,
              and one stage's bytes per device (programs/compile/pipeline_report.py)
  estimate:   the step time counted from the optimized HLO on the chip's constants, its MFU,
              each part's time and the dominant one (programs/compile/estimate_report.py)
  step_time:  a bound for comparison, not an estimate (programs/compile/step_bound.py):
              peak_flops_per_device, peak_source,
              seconds_at_100_mfu, seconds_at_50_mfu, tokens_per_s_per_device_at_50_mfu; for
              a train step under model.quantization "int8" also int8: {peak_ops_per_device
              (null where none is known), int8_flops_per_step (the blocks' weight matmuls),
              seconds_at_50_mfu,
              tokens_per_s_per_device_at_50_mfu} (those matmuls at the int8 peak, the rest at
              the bf16 one)
  dots:       {int8, float}: the matmul instructions of the optimized HLO (aot.dot_counts),
              or null (analyses kept by an older version)
  optimizer:  moment_dtype, offload_state (the optimizer's)
  remat_policies, optimizer_options: (with --compile_remat_policies,
              --compile_optimizer_options) column (each row's name field: remat_policy,
              optimizer_option), title, heading, own (the config's own choice, or null),
              per_device_batch_size, rows: [{<column>, description, bytes (the deciding
              bytes), available, host_bytes (in host memory), verdict, margin,
              compile_seconds, compile_cached}]: programs/compile/setting_tables.py
  max_batch:  (with --compile_find_max_batch) see programs/compile/max_batch.py

Longer than 300 lines with a reason: the schema above and the code that fills each of its
sections (memory verdict, analytic bytes, FLOPs) live together, so a
change of one is seen beside the other; the search for a largest batch is its own module.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from lingvo_lite import mfu
from lingvo_lite.on_mesh import evaluation
from lingvo_lite.programs.compile import (buffer_assignment, estimate_report, fit_advice,
                                         pipeline_report, step_bound)
from lingvo_lite.programs.compile.aot import CompileResult, MemoryBytes, OutOfMemory
from lingvo_lite.training.train_state import HOST_MEMORY

SCHEMA = "lingvo_lite.compile_report/1"
FITS, DOES_NOT_FIT, UNKNOWN = "FITS", "DOES NOT FIT", "UNKNOWN"
_GIB = 2**30


def shard_bytes(leaf: Any) -> int:
  """Bytes of one device's shard of an abstract array with a NamedSharding."""
  shape = leaf.sharding.shard_shape(leaf.shape)
  return math.prod(shape) * np.dtype(leaf.dtype).itemsize


def _state_group(path: tuple) -> str:
  """`parameters`, the optimizer moment's name (`mu`, `nu`), or `other_state`."""
  keys = [getattr(k, "name", getattr(k, "key", getattr(k, "idx", None))) for k in path]
  if keys and keys[0] == "params":
    return "parameters"
  if keys and keys[0] == "frozen":  # A LoRA base, or a DPO reference: no moments.
    return "frozen parameters"
  for key in keys:
    if key in ("mu", "nu"):
      return f"optimizer {'first' if key == 'mu' else 'second'} moment ({key})"
  return "other_state"


def analytic_bytes(result: CompileResult) -> dict[str, Any]:
  """The argument bytes per device counted from the state's shapes and shardings."""
  jitted = result.jitted
  if result.program == "train":
    state = jitted.sharded_state.abstract
    spec = jitted.train_batch_spec()
  else:
    abstract = jitted.sharded_state.abstract
    state = {"params": abstract.params, "frozen": abstract.frozen}
    spec = evaluation.largest_set(jitted.setup)[1].batch_spec()
  groups: dict[str, int] = {"parameters": 0}
  host: dict[str, int] = {}  # What lives in host memory (an offloaded optimizer state).
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    group = _state_group(path)
    kept = host if leaf.sharding.memory_kind == HOST_MEMORY else groups
    kept[group] = kept.get(group, 0) + shard_bytes(leaf)
  batch = sum(math.prod(jitted.batch_sharding.shard_shape(shape)) * np.dtype(dtype).itemsize
              for shape, dtype in spec.values())
  for kept in (groups, host):
    other = kept.pop("other_state", None)
    if other is not None:
      kept["other_state"] = other  # Step counters, after the parameters and moments.
  groups["batch"] = batch
  memory = result.memory
  return {"by_part": groups, "total": sum(groups.values()),
          "xla_arguments": memory.arguments if memory else None,
          "host_by_part": host, "host_total": sum(host.values()),
          "xla_host_arguments": memory.host_arguments if memory else None}


def deciding(memory: MemoryBytes | None, out_of_memory: OutOfMemory | None,
             platform: str) -> tuple[int | None, str, str]:
  """(bytes the verdict compares, which number that is and why, source) of one compile:
  the rule every program's verdict uses (train, eval, and each decode function)."""
  if out_of_memory is not None:
    return (out_of_memory.required, "the bytes XLA's RESOURCE_EXHAUSTED error states "
            "(a TPU compile that does not fit gives no memory analysis)", "resource_exhausted")
  if memory is None:
    return None, "XLA reported no memory analysis (0 or -1) on this backend", "none"
  if platform == "tpu" and memory.host_temporaries and memory.device_allocated:
    # XLA:TPU's peak counts temporaries it keeps in host memory (a remat policy's offloaded
    # activations), and not by adding them: MaxText128B's was its arguments + its 12 GiB of
    # host temporaries (17.47 GiB), its 8.52 GiB of device temporaries not in it, so nothing
    # subtracted from it leaves the device's. Its buffer assignment says what is in HBM.
    return (memory.device_allocated + memory.generated_code,
            "the bytes XLA:TPU's buffer assignment allocates in the device's memory (its "
            "arguments, outputs, constants and heap-packed temporaries) + generated code: its "
            "peak counts the temporaries it keeps in host memory (offloaded activations), "
            "which the device does not hold", "memory_analysis")
  if platform == "tpu" and memory.peak:
    # Measured on a v5e (bench/results/2026-12-07/tpu5): a Llama1BOneChip step whose sum
    # below is 16.03 GiB, past the 15.75 XLA:TPU allows, ran there at 56.3% MFU; its peak
    # was 12.95 GiB. The sum adds buffers that are never live together (a scan's stack and
    # the broadcast it starts from); the heap simulation is what XLA:TPU itself holds a
    # step to, and the chip held to it.
    offloaded = memory.host_state  # XLA:TPU's peak counts host-memory arguments and outputs.
    return (memory.peak - offloaded,
            "XLA:TPU's peak of live buffers (its heap simulation)"
            + (" less the arguments and outputs it keeps in host memory, which that peak "
               "counts" if offloaded else "")
            + "; the chip holds a step to it, not to arguments + outputs - aliased + "
            "temporaries, which counts buffers never live together (a v5e ran a 16.03 GiB "
            "sum whose peak was 12.95 GiB); XLA:TPU itself refuses a step above its own "
            "limit, a little under the datasheet's (15.75 of a v5e's 16 GiB)",
            "memory_analysis")
  return (memory.total, "arguments + outputs - aliased + temporaries + generated code "
          "(on CPU and GPU jaxlib's peak_memory_in_bytes leaves temporaries out)",
          "memory_analysis")


def judge(needed: int | None, available: int | None,
          source: str = "memory_analysis") -> tuple[str, dict[str, float] | None]:
  """(verdict, margin) of `needed` bytes per device against `available`; `source` is
  `deciding`'s. A compile XLA refused (RESOURCE_EXHAUSTED) never fits, whatever its rounded
  figures say: "temporaries (15.75G) exceeds available HBM (15.75G)" parses to equal bytes."""
  if needed is None or available is None:
    return UNKNOWN, None
  exhausted = source == "resource_exhausted"
  verdict = FITS if needed <= available and not exhausted else DOES_NOT_FIT
  return verdict, {"bytes": available - needed, "fraction": (available - needed) / available}


def target_fields(target: Any) -> dict[str, Any]:
  """The report's `target` (a lingvo_lite.target.Target)."""
  return {"name": target.name, "platform": target.platform,
          "device_kind": target.device_kind, "num_devices": target.num_devices,
          "num_processes": target.num_processes, "num_slices": target.num_slices,
          "memory_per_device": target.memory_per_device, "memory_source": target.memory_source}


def build(result: CompileResult) -> dict[str, Any]:
  """The report of one compile, as the JSON schema above."""
  jitted, target, setup = result.jitted, result.jitted.target, result.jitted.setup
  data = setup.train_data if result.program == "train" else evaluation.largest_set(setup)[1]
  deciding_bytes, rule, source = deciding(result.memory, result.out_of_memory,
                                          target.platform)
  available = target.memory_per_device
  if result.out_of_memory is not None:
    available = result.out_of_memory.available
  verdict, margin = judge(deciding_bytes, available, source)
  memory = result.memory
  model_flops = mfu.model_flops_per_step(setup.model, data.global_batch_size,
                                         data.sequence_length)
  if result.program == "eval":
    model_flops /= 3  # Forward only: the 6N of training counts forward and backward.
  tokens = data.global_batch_size * data.sequence_length
  step_time = step_bound.section(target, setup, result.program, model_flops, tokens)
  mesh = {axis: int(size) for axis, size in jitted.mesh.shape.items()}
  analytic = analytic_bytes(result)
  return {
      "schema": SCHEMA,
      "target": target_fields(target),
      "program": result.program,
      "mesh": mesh,
      "parameters": setup.model.num_parameters(),
      "remat_policy": getattr(setup.model, "remat_policy", None),
      "optimizer": {"moment_dtype": getattr(setup.optimizer, "moment_dtype", None),
                    "offload_state": getattr(setup.optimizer, "offload_state", False)},
      "batch": {"global_batch_size": data.global_batch_size,
                "per_device_batch_size": data.global_batch_size / target.num_devices,
                "sequence_length": data.sequence_length},
      "memory": {
          **({"arguments": memory.arguments, "outputs": memory.outputs,
              "aliased": memory.aliased, "temporaries": memory.temporaries,
              "generated_code": memory.generated_code, "total": memory.total,
              "peak": memory.peak, "device_allocated": memory.device_allocated,
              "host": {"arguments": memory.host_arguments, "outputs": memory.host_outputs,
                       "aliased": memory.host_aliased,
                       "temporaries": memory.host_temporaries}} if memory else {}),
          "deciding": deciding_bytes, "deciding_rule": rule, "source": source,
          "available": available,
          **({"xla_error": result.out_of_memory.message} if result.out_of_memory else {})},
      "verdict": verdict,
      "margin": margin,
      "next_knob": _next_knob(result, verdict, mesh, analytic, available),
      "largest_buffers": [vars(b) for b in result.largest_buffers],
      "analytic": analytic,
      "flops": {"xla_per_device": result.xla_flops_per_device, "model_per_step": model_flops,
                "model_per_device": model_flops / target.num_devices},
      "compile_seconds": result.seconds,
      "compile_cached": result.cached,
      "estimate": estimate_report.section(
          result.estimate if result.out_of_memory is None else None, target.device_kind,
          model_flops / target.num_devices, tokens / target.num_devices,
          estimate_report.pipeline_of(setup, target.num_devices)),
      "pipeline": pipeline_report.section(jitted, deciding_bytes),
      "step_time": step_time,
      "dots": result.dots,
  }


def _next_knob(result: CompileResult, verdict: str, mesh: dict[str, int],
               analytic: dict[str, Any], available: int | None) -> str | None:
  """The one line naming what to change first, for a step that does not fit."""
  if verdict != DOES_NOT_FIT:
    return None
  state = analytic["total"] - analytic["by_part"]["batch"]
  return fit_advice.next_knob(result.jitted.setup, result.jitted.target, result.program, mesh,
                              state, available)


def cached_note(report: dict) -> str:
  """What the compile time line adds where XLA's analyses came from the cache."""
  return (" (the first compile's; this run read XLA's analyses of the same program from the "
          "compilation cache)" if report.get("compile_cached") else "")


def gib(n: float | None) -> str:
  """Bytes in the unit that keeps three significant digits readable."""
  if n is None:
    return "n/a"
  for unit, size in (("GiB", _GIB), ("MiB", 2**20), ("KiB", 2**10)):
    if abs(n) >= size:
      return f"{n / size:.3f} {unit}"
  return f"{n:.0f} B"


def verdict_lines(report: dict[str, Any]) -> list[str]:
  """The verdict, what it needs of what is available, and the rule that decided."""
  m, verdict = report["memory"], report["verdict"]
  if verdict == UNKNOWN:
    return [f"verdict: UNKNOWN: {m['deciding_rule']}; no claim that it fits"]
  margin = report["margin"]
  source = ("as XLA states it" if m["source"] == "resource_exhausted"
            else report["target"]["memory_source"])
  return [f"verdict: {verdict}: needs {gib(m['deciding'])} per device of "
          f"{gib(m['available'])} ({source}); "
          f"margin {margin['bytes'] / _GIB:+.3f} GiB ({margin['fraction']:+.1%})",
          f"  decided by: {m['deciding_rule']}"] + (
              [f"  {report['next_knob']}"] if report.get("next_knob") else [])


def argument_bytes_line(report: dict[str, Any], of: str = "") -> str:
  """The analytic argument bytes per device, by part, beside XLA's count of them; `of` says
  whose they are where a report compiles several functions."""
  a = report["analytic"]
  parts = ", ".join(f"{name} {gib(size)}" for name, size in a["by_part"].items())
  padding = "; XLA:TPU pads arrays to its tiles" if report["target"]["platform"] == "tpu" else ""
  return (f"  analytic argument bytes per device{of}: {parts}; total {gib(a['total'])} "
          f"(XLA arguments: {gib(a['xla_arguments'])}{padding})")


def host_bytes_lines(report: dict[str, Any]) -> list[str]:
  """The state kept in host memory between steps (an offloaded optimizer state), by part."""
  a = report["analytic"]
  if not a.get("host_by_part"):
    return []
  parts = ", ".join(f"{name} {gib(size)}" for name, size in a["host_by_part"].items())
  return [f"  analytic bytes in host memory per device (not in the total above): {parts}; "
          f"total {gib(a['host_total'])} (XLA host arguments: {gib(a['xla_host_arguments'])})"]


def memory_text(m: dict[str, Any]) -> str:
  """XLA's memory analysis of one compile (a report's `memory`), in words."""
  host = m.get("host") or {}
  return (f"arguments {gib(m['arguments'])}, outputs {gib(m['outputs'])}, aliased (donated) "
          f"{gib(m['aliased'])}, temporaries {gib(m['temporaries'])}, generated code "
          f"{gib(m['generated_code'])}; total {gib(m['total'])}"
          + (f"; XLA peak {gib(m['peak'])}" if m.get("peak") else "")
          + (f"; allocated in device memory {gib(m['device_allocated'])}"
             if m.get("device_allocated") else "")
          + (f"; in host memory: arguments {gib(host['arguments'])}, outputs "
             f"{gib(host['outputs'])}, aliased {gib(host['aliased'])}, temporaries "
             f"{gib(host['temporaries'])}" if any(host.values()) else ""))


def buffer_lines(buffers: list[dict[str, Any]], where: str = "") -> list[str]:
  if not buffers:
    return []
  lines = [f"  largest buffers (optimized HLO{where}):"]
  for b in buffers:
    space = b.get("memory_space", buffer_assignment.DEVICE_SPACE)
    where_kept = {buffer_assignment.DEVICE_SPACE: "",
                  buffer_assignment.HOST_SPACE: " (in host memory)"}.get(
                      space, f" (memory space {space})")
    lines.append(f"    {gib(b['bytes']):>12}  {b['shape']:<28} {b['instruction']}{where_kept}  "
                 f"{b['op_name'][-90:]}")
  return lines


def to_text(report: dict[str, Any]) -> str:
  """The report for people: the verdict first, then what it rests on."""
  t, m, f = report["target"], report["memory"], report["flops"]
  batch = report["batch"]
  lines = [f"compile of the {report['program']} step for {t['name']} ({t['num_devices']} x "
           f"{t['device_kind']}, {t['num_processes']} process(es), {t['num_slices']} "
           f"slice(s)); mesh {' '.join(f'{k}={v}' for k, v in report['mesh'].items())}",
           f"  parameters: {report['parameters']:,}; batch {batch['global_batch_size']} x "
           f"{batch['sequence_length']} ({batch['per_device_batch_size']:g} per device)"]
  lines += verdict_lines(report)
  if "arguments" in m:
    lines.append(f"  XLA memory analysis per device: {memory_text(m)}")
  if m.get("xla_error"):
    lines.append(f"  XLA: {m['xla_error']}")
  lines.append(argument_bytes_line(report))
  lines += host_bytes_lines(report)
  lines += buffer_lines(report["largest_buffers"])
  xla_flops = f["xla_per_device"]
  lines.append(f"  FLOPs per step: model {f['model_per_step']:.4g} ({f['model_per_device']:.4g} "
               f"per device); XLA cost analysis "
               f"{'n/a' if xla_flops is None else f'{xla_flops:.4g}'} per device (it counts "
               "a loop body once: a scan over layers or micro-batches counts one iteration)")
  lines.append(f"  compile time: {report['compile_seconds']:.1f} s{cached_note(report)}")
  lines += pipeline_report.lines(report.get("pipeline"), report.get("estimate"))
  lines += estimate_report.lines(report.get("estimate"))
  lines += step_bound.lines(report)
  lines += _hint_lines(report) + _table_lines(report)
  if "max_batch" in report:
    lines += _max_batch_lines(report["max_batch"])
  return "\n".join(lines) + "\n"


def _hint_lines(report: dict[str, Any]) -> list[str]:
  """For a train step, the settings the config chose that a table could compare, each with
  the flag that makes its table (where that table is not in the report)."""
  if report["program"] != "train":
    return []
  lines = []
  policy = report.get("remat_policy")
  if policy and "remat_policies" not in report:
    lines.append(f"  remat policy: {policy}; which policies fit at this batch: "
                 "--compile_remat_policies=all (a compile each)")
  optimizer = report.get("optimizer")
  if optimizer and "optimizer_options" not in report:
    dtype = optimizer["moment_dtype"] or "the parameters' dtype"
    where = "host memory between steps" if optimizer["offload_state"] else "the device"
    lines.append(f"  optimizer moments: {dtype}, on {where}; which ways of keeping them fit: "
                 "--compile_optimizer_options=all (a compile each)")
  return lines


def _table_lines(report: dict[str, Any]) -> list[str]:
  """The report's setting tables (setting_tables.py compiles, this only shows), with each
  choice's largest batch where max_batch.py searched."""
  lines = []
  for data in report.values():
    if not (isinstance(data, dict) and "column" in data and "rows" in data):
      continue
    column = data["column"]
    best = {row[column]: row["max_per_device_batch_size"]
            for row in report.get("max_batch", {}).get("policies", []) if column in row}
    host = any(row.get("host_bytes") for row in data["rows"])
    own = data["own"] if data["own"] is not None else "none of these"
    lines += [f"  {data['heading']} at this batch ({data['per_device_batch_size']:g} per "
              f"device; the verdict above is the config's own, {own}):",
              f"    {data['title']:<35} needs per device"
              + ("    in host memory" if host else "") + "  verdict       margin"
              + ("                    max per device" if best else "")]
    for row in data["rows"]:
      margin = row["margin"]
      shown = ("n/a" if margin is None else
               f"{margin['bytes'] / _GIB:+.3f} GiB ({margin['fraction']:+.1%})")
      line = (f"    {row[column]:<35} {gib(row['bytes']):>16}"
              + (f"  {gib(row.get('host_bytes') or 0):>16}" if host else "")
              + f"  {row['verdict']:<12}  {shown:<24}")
      if best:
        most = best.get(row[column])
        line += f"  {'n/a' if most is None else most:>14}"
      lines.append(line.rstrip())
  return lines


def _max_batch_lines(data: dict[str, Any]) -> list[str]:
  """The report's max_batch section: max_batch.py searches, this only shows."""
  titles = {"remat_policy": "remat policy", "optimizer_option": "optimizer option"}
  columns = {next(key for key in titles if key in row) for row in data["policies"]}
  title = titles[columns.pop()] if len(columns) == 1 else "setting"
  lines = ["  largest per-device batch that fits:",
           f"    {title:<35} max per device  compiles (batch: GiB, fits)"]
  for row in data["policies"]:
    made = ", ".join(f"{c['per_device_batch_size']}: {c['bytes'] / 2**30:.2f} "
                     f"{'yes' if c['fits'] else 'no'}" for c in row["compiles"])
    best = row["max_per_device_batch_size"]
    name = next(row[key] for key in titles if key in row)
    lines.append(f"    {name:<35} {'n/a' if best is None else best:>14}  {made}"
                 + (f"  ({row['note']})" if row["note"] else ""))
  return lines
