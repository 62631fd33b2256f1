"""Ahead-of-time compilation of the decode functions for a target, and their report.

`--mode=compile --compile_program=decode` compiles what the generator runs (the jitted
functions of decode/jitted.DecodeSteps, with its shardings), lowered from shapes: the generate
loop, and the prefill at the largest prompt bucket (the one that holds the most memory:
its activations grow with the bucket, the state does not change). Each function's need per
device is counted by the rule of the train step's verdict (compile_report.deciding); the
larger of the two is the peak, and it is compared with the target's memory per device.
The state both functions hold is the decode state (decoding.DecodeState), mostly the model's
KV cache (the transformer families': [slots, kv_heads, entries, head_dim] or [slots, entries,
kv_heads * head_dim] per layer, the model's `cache_layout()`, a sliding layer's entries its
window, a full layer's cache_length: models/kv_cache.py),
sharded with the slots over the data-parallel axes and the heads over `tensor`: its bytes per
device are counted from that sharding, beside the parameters'.

report.json, schema "lingvo_lite.compile_report/1" (the train report's target, mesh,
parameters, verdict, margin and largest_buffers, and):
  program:    "decode"
  decode:     slots, slots_per_device, cache_length, prefill_bucket (the one compiled),
              prefill_buckets
  functions:  {generate, prefill}: arguments, outputs, aliased, temporaries, generated_code,
              total, peak (as the train report's memory), deciding, deciding_rule, source,
              available, verdict, compile_seconds, xla_flops_per_device; xla_error where XLA
              refused it for memory
  memory:     deciding (the larger function's: the peak per device), deciding_function,
              deciding_rule, source, available
  kv_cache:   bytes_per_device (this device's shard of the keys and values), bytes_total
              (the model family's cache_bytes), shape and shard_shape of the first cache
              array's keys (layer 0's; with scanned layers, the layers it holds stacked),
              dtype; a transformer family's layout ("heads", "positions") and dimensions
              (their names: slots, kv_heads, entries, head_dim, "kv_heads * head_dim",
              layers)
  analytic:   by_part (the generate loop's arguments per device: parameters, kv_cache,
              other_state (tokens, log-probabilities, per-slot lengths, sampling, seeds),
              inputs), total, xla_arguments (generate's)
  largest_buffers: of the deciding function
  compile_seconds: both compiles; compile_cached: both came from the compilation cache
              (programs/compile/analyses.py)
  max_slots:  (with --compile_find_max_batch) max_slots, max_slots_per_device, unit (the
              data-parallel size: valid slot counts are its multiples), line
              (bytes_at_zero, bytes_per_slot: per device), note, compiles
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from lingvo_lite import target as targets
from lingvo_lite.decode.jitted import DecodeSteps
from lingvo_lite.experiment import Setup
from lingvo_lite.models import kv_cache
from lingvo_lite.programs.compile import aot, compile_report, max_batch
from lingvo_lite.programs.compile.compile_report import DOES_NOT_FIT, FITS, UNKNOWN, gib
from lingvo_lite.weights import job_params

FUNCTIONS = ("generate", "prefill")


@dataclasses.dataclass
class DecodeCompileResult:
  """The two compiles of one Setup's decode functions for a target."""

  steps: DecodeSteps
  target: targets.Target
  prefill_bucket: int
  compiled: dict[str, aot.Compiled]  # By name in FUNCTIONS.

  @property
  def seconds(self) -> float:
    return sum(c.seconds for c in self.compiled.values())


def compile_decode(setup: Setup, target: targets.Target) -> DecodeCompileResult:
  """Lowers and compiles the generate loop and the largest prefill for `target`.

  Raises:
    UsageError: decode.slots does not split over the target mesh's data-parallel axes.
  """
  with targets.active(target):
    steps = DecodeSteps(setup, job_params.mesh_of(setup, target.devices))
    bucket = max(steps.buckets)
    compiled = {}
    for name, lower in (("generate", steps.lower_generate),
                        ("prefill", lambda: steps.lower_prefill(bucket))):
      started = time.perf_counter()
      compiled[name] = aot.compile_lowered(lower(), started)
  return DecodeCompileResult(steps, target, bucket, compiled)


def _function(compiled: aot.Compiled, target: targets.Target) -> dict[str, Any]:
  deciding, rule, source = compile_report.deciding(compiled.memory, compiled.out_of_memory,
                                                   target.platform)
  available = target.memory_per_device
  if compiled.out_of_memory is not None:
    available = compiled.out_of_memory.available
  memory = compiled.memory
  return {
      **({"arguments": memory.arguments, "outputs": memory.outputs, "aliased": memory.aliased,
          "temporaries": memory.temporaries, "generated_code": memory.generated_code,
          "total": memory.total, "peak": memory.peak} if memory else {}),
      "deciding": deciding, "deciding_rule": rule, "source": source, "available": available,
      "verdict": compile_report.judge(deciding, available, source)[0],
      "compile_seconds": compiled.seconds,
      "xla_flops_per_device": compiled.xla_flops_per_device,
      **({"xla_error": compiled.out_of_memory.message} if compiled.out_of_memory else {})}


def _deciding_function(functions: dict[str, dict[str, Any]]) -> str:
  """The function the verdict rests on: one that does not fit, else one XLA said nothing
  about (then no claim is made), else the one that needs the most."""
  rank = {DOES_NOT_FIT: 2, UNKNOWN: 1, FITS: 0}
  return max(FUNCTIONS, key=lambda name: (rank[functions[name]["verdict"]],
                                          functions[name]["deciding"] or 0))


def kv_cache_bytes(state: Any, model: Any, slots: int, cache_length: int) -> dict[str, Any]:
  """The KV cache of an abstract, sharded decode state: one device's shard and the whole."""
  leaves = jax.tree.leaves(state.cache)
  keys = leaves[0]  # One layer's keys (unrolled), or every layer's (scanned).
  found = {"bytes_per_device": sum(map(compile_report.shard_bytes, leaves)),
           "bytes_total": model.cache_bytes(slots, cache_length),
           "shape": list(keys.shape), "shard_shape": list(keys.sharding.shard_shape(keys.shape)),
           "dtype": np.dtype(keys.dtype).name}
  # A transformer family's layout (models/kv_cache.py), named with its dimensions; another
  # family's cache is its own.
  layout = getattr(model, "cache_layout", lambda: None)()
  if layout is not None:
    stacked = len(keys.shape) > len(kv_cache.dimensions(layout))
    found.update(layout=layout, dimensions=list(kv_cache.dimensions(layout, stacked)))
  return found


def build(result: DecodeCompileResult) -> dict[str, Any]:
  """The report of the decode compiles, as the schema above."""
  steps, target = result.steps, result.target
  setup = steps.setup
  functions = {name: _function(result.compiled[name], target) for name in FUNCTIONS}
  decider = _deciding_function(functions)
  chosen = functions[decider]
  verdict, margin = compile_report.judge(chosen["deciding"], chosen["available"],
                                         chosen["source"])
  other = "prefill" if decider == "generate" else "generate"
  what = {"generate": "the generate loop", "prefill": f"the prefill at bucket "
          f"{result.prefill_bucket}"}
  rule = (f"{what[decider]} (the other function, {what[other]}, needs "
          f"{gib(functions[other]['deciding'])}); {chosen['deciding_rule']}")
  state = steps.abstract_state()
  cache = kv_cache_bytes(state, steps.model, steps.slots, steps.cache_length)
  parameters = sum(map(compile_report.shard_bytes, jax.tree.leaves(steps.abstract_params())))
  slots_per_device = state.lengths.sharding.shard_shape(state.lengths.shape)[0]
  other_state = sum(map(compile_report.shard_bytes,
                        jax.tree.leaves(state._replace(cache=None))))
  inputs = 4 + slots_per_device  # generate's int32 step limit and bool [slots] `finished`.
  by_part = {"parameters": parameters, "kv_cache": cache["bytes_per_device"],
             "other_state": other_state, "inputs": inputs}
  generate = result.compiled["generate"].memory
  return {
      "schema": compile_report.SCHEMA,
      "target": compile_report.target_fields(target),
      "program": "decode",
      "mesh": {axis: int(size) for axis, size in steps.mesh.shape.items()},
      "parameters": setup.model.num_parameters(),
      "decode": {"slots": steps.slots, "slots_per_device": slots_per_device,
                 "cache_length": steps.cache_length, "prefill_bucket": result.prefill_bucket,
                 "prefill_buckets": list(steps.buckets)},
      "functions": functions,
      "memory": {"deciding": chosen["deciding"], "deciding_function": decider,
                 "deciding_rule": rule, "source": chosen["source"],
                 "available": chosen["available"]},
      "verdict": verdict,
      "margin": margin,
      "kv_cache": cache,
      "analytic": {"by_part": by_part, "total": sum(by_part.values()),
                   "xla_arguments": generate.arguments if generate else None},
      "largest_buffers": [vars(b) for b in result.compiled[decider].largest_buffers],
      "compile_seconds": result.seconds,
      "compile_cached": all(c.cached for c in result.compiled.values()),
  }


def search_slots(setup: Setup, target: targets.Target,
                 first: DecodeCompileResult) -> dict[str, Any]:
  """The largest decode.slots that fits `target` (max_batch.find_largest over slots per
  device, in steps of the data-parallel size), as report data."""
  partitioner = setup.partitioner
  unit = partitioner.data_parallel_size(partitioner.mesh_axis_sizes(target.num_devices))
  compiles: dict[int, dict[str, Any]] = {}  # By slots per device.

  def record(k: int, result: DecodeCompileResult) -> dict[str, Any]:
    report = build(result)
    compiles[k] = {"slots": k * unit, "slots_per_device": k,
                   "bytes": report["memory"]["deciding"],
                   "available": report["memory"]["available"],
                   "fits": report["verdict"] == FITS, "seconds": result.seconds}
    return compiles[k]

  def measure(k: int) -> dict[str, Any]:
    if k not in compiles:
      candidate = dataclasses.replace(setup, decode=dataclasses.replace(setup.decode,
                                                                        slots=k * unit))
      with targets.active(target):
        candidate.validate(target)
      record(k, compile_decode(candidate, target))
    return compiles[k]

  record(first.steps.slots // unit, first)  # The report's own compile is one of the points.
  best, line, note = max_batch.find_largest(
      measure, compiles, f"even {unit} slots (one per data-parallel device) do not fit")
  return {"max_slots": None if best is None else best * unit,
          "max_slots_per_device": best, "unit": unit,
          "line": line and {"bytes_at_zero": line["bytes_at_zero"],
                            "bytes_per_slot": line["bytes_per_unit"]},
          "note": note, "compiles": [compiles[k] for k in sorted(compiles)]}


def to_text(report: dict[str, Any]) -> str:
  """The report for people: the verdict first, then what it rests on."""
  t, d, a, cache = report["target"], report["decode"], report["analytic"], report["kv_cache"]
  lines = [f"compile of the decode functions (the generate loop, and the prefill at its largest "
           f"bucket, {d['prefill_bucket']}) for {t['name']} ({t['num_devices']} x "
           f"{t['device_kind']}, {t['num_processes']} process(es), {t['num_slices']} "
           f"slice(s)); mesh {' '.join(f'{k}={v}' for k, v in report['mesh'].items())}",
           f"  parameters: {report['parameters']:,}; decode.slots {d['slots']} "
           f"({d['slots_per_device']} per device), decode.cache_length {d['cache_length']}, "
           f"prefill buckets {', '.join(map(str, d['prefill_buckets']))}"]
  lines += compile_report.verdict_lines(report)
  shape = ", ".join(map(str, cache["shape"]))
  # The first array's (layer 0's kind): a sliding layer's entries are its window, a full
  # layer's the cache length, so the shape is named by entries.
  axes = "of layer 0's array"
  if "dimensions" in cache:
    axes = f"[{', '.join(cache['dimensions'])}] {axes} (layout {cache['layout']!r})"
  lines.append(f"  KV cache per device: {gib(cache['bytes_per_device'])} of "
               f"{gib(cache['bytes_total'])} (keys and values {cache['dtype']}[{shape}] "
               f"{axes}, per device [{', '.join(map(str, cache['shard_shape']))}]); "
               f"parameters per device {gib(a['by_part']['parameters'])}")
  for name, f in report["functions"].items():
    where = f" (bucket {d['prefill_bucket']})" if name == "prefill" else ""
    analysis = (compile_report.memory_text(f) if "arguments" in f
                else f"no analysis ({f['deciding_rule']})")
    lines.append(f"  {name}{where}: XLA memory analysis per device: {analysis}; compiled in "
                 f"{f['compile_seconds']:.1f} s")
    if f.get("xla_error"):
      lines.append(f"    XLA: {f['xla_error']}")
  lines.append(compile_report.argument_bytes_line(report, " of the generate loop"))
  decider = report["memory"]["deciding_function"]
  lines += compile_report.buffer_lines(
      report["largest_buffers"], f" of the {'generate loop' if decider == 'generate' else decider}")
  flops = ", ".join(
      f"{name} " + ("n/a" if f["xla_flops_per_device"] is None
                    else f"{f['xla_flops_per_device']:.4g}")
      for name, f in report["functions"].items())
  lines.append(f"  XLA cost analysis, FLOPs per device: {flops} (it counts a loop body once: "
               "the generate loop's one token)")
  lines.append(f"  compile time: {report['compile_seconds']:.1f} s"
               f"{compile_report.cached_note(report)}")
  if "max_slots" in report:
    lines += _max_slots_text(report["max_slots"])
  return "\n".join(lines) + "\n"


def _max_slots_text(data: dict[str, Any]) -> list[str]:
  made = ", ".join(f"{c['slots']}: {c['bytes'] / 2**30:.2f} {'yes' if c['fits'] else 'no'}"
                   for c in data["compiles"] if c["bytes"] is not None)
  best = data["max_slots"]
  shown = "n/a" if best is None else f"{best} ({data['max_slots_per_device']} per device)"
  return [f"  largest decode.slots that fits: {shown}, in steps of {data['unit']} (the "
          f"data-parallel size); compiles (slots: GiB, fits): {made}"
          + (f"  ({data['note']})" if data["note"] else "")]
