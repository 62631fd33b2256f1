"""Where a step's device time goes: a jax.profiler trace of a train or decode step, summed by op.

  python bench/tpu_profile.py train --experiment Llama1BOneChip --set model.remat_policy='minimal' \
      --out DIR [--steps 3]
  python bench/tpu_profile.py decode --shape smollm2 --batch 64 --out DIR [--new_tokens 32]

Runs the program's own jitted function (`training/jitted.JittedSteps.train_step`, or the
generate loop of `decode/jitted.DecodeSteps`, as `bench/accelerator_mfu.py` and
`bench/tpu_decode.py` build them), warms it up, then traces a few calls with `jax.profiler`
and reads the trace back with `jax.profiler.ProfileData` (no TensorBoard or xprof needed on
the machine). Prints, and writes as DIR/<name>.json: the device time per traced step, the
ops that took it (the device plane's "XLA Ops" line, summed by op name, largest first, with
each op's share and its HLO category where the trace gives one), and the share of each
category (matmuls and convolutions, fusions, collectives, copies, custom calls: the Pallas
kernels). An op's time is its own: a loop's event spans its body's ops, which are counted
where they ran. The trace itself is DIR/<name>.xplane.pb.gz, for TensorBoard's profile
plugin; `python bench/tpu_profile.py read --xplane FILE --calls 3` sums a kept one again.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import jax
import jax.numpy as jnp

from bench import tpu_decode
from lingvo_lite import executor
from lingvo_lite.decode.jitted import DecodeSteps
from lingvo_lite.training.jitted import JittedSteps
# pylint: enable=wrong-import-position

_SHOWN_OPS = 40
_OP_TEXT = 600   # Characters of an op's HLO kept in the JSON summary ...
_OP_SHOWN = 240  # ... and printed.


def _args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("what", choices=("train", "decode", "read"))
  parser.add_argument("--xplane", help="read: a trace written here (.xplane.pb[.gz])")
  parser.add_argument("--calls", type=int, default=3, help="read: the calls it traced")
  parser.add_argument("--steps_per_call", type=int, default=1)
  parser.add_argument("--experiment", default="Llama1BOneChip")
  parser.add_argument("--set", action="append", default=[])
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--shape", default="smollm2", choices=tuple(tpu_decode.SHAPES))
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--prompt_length", type=int, default=128)
  parser.add_argument("--new_tokens", type=int, default=32)
  parser.add_argument("--name")
  parser.add_argument("--out")
  return parser.parse_args()


def _train_calls(args: argparse.Namespace):
  """(a function running one train step, the steps it runs per call)."""
  setup = executor.build_experiment(args.experiment, args.set)
  jitted = JittedSteps(setup)
  with jitted.activated():
    compiled = jitted.train_step.lower(jitted.sharded_state.abstract,
                                       jitted.abstract_batch()).compile()
    holder = {"state": jitted.init_state()}
    batch = jitted.global_batch(setup.train_data.batch(0, jax.process_index(),
                                                       jax.process_count()))

  def call():
    holder["state"], metrics = compiled(holder["state"], batch)
    jax.block_until_ready(metrics["loss"])
  return call, 1


def _decode_calls(args: argparse.Namespace):
  """(a function running `new_tokens` decode steps of every slot, the steps it runs)."""
  warm = 8
  cache_length = -(-(args.prompt_length + 4 * args.new_tokens + warm + 8) // 128) * 128
  setup = executor.build_experiment("Llama1B", [
      *tpu_decode.SHAPES[args.shape], f"decode.slots={args.batch}",
      f"decode.cache_length={cache_length}", f"decode.prefill_buckets=({args.prompt_length},)",
      "decode.stop_at_eos=False", f"decode.max_new_tokens={args.new_tokens}", *args.set])
  steps = DecodeSteps(setup)
  params = steps.decode_form(jax.jit(setup.model.init)(
      jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"])
  generate = steps.lower_generate().compile()
  finished = jnp.zeros((args.batch,), bool)
  holder = {"state": tpu_decode.prefilled(steps, params, args.batch, args.prompt_length,
                                          cache_length)}

  def call():
    with steps.activated():
      holder["state"] = generate(params, holder["state"], jnp.int32(args.new_tokens), finished)
      holder["state"].tokens.block_until_ready()
  return call, args.new_tokens


# The opcode after the result's type (a tuple type starts with "("; layouts' T(8,128) and
# S(1) are upper case).
_OPCODE = re.compile(r"(?:^|\s)([a-z][a-z0-9_-]*)\(")
# (category, pattern over the instruction's name, opcode and fusion kind), the first that
# matches. On a TPU a fusion of kind kOutput is a matmul with what XLA fused into its output
# (a gradient written into the scanned layers' stack, say), whatever its name.
_CATEGORIES = (("kernel", re.compile(r"pallas|custom-call|custom_call|splash|paged_attention")),
               ("collective", re.compile(r"all-reduce|all-gather|reduce-scatter|all-to-all|"
                                         r"collective-permute")),
               ("matmul", re.compile(r"convolution|\bdot\b|kind=kOutput")),
               ("copy", re.compile(r"^%?copy|copy-start|copy-done")),
               ("control", re.compile(r"^%?(while|conditional|call)[.( ]")))


def _category(hlo: str) -> str:
  """An op's category (_CATEGORIES) from its HLO text."""
  name, _, rest = hlo.partition(" = ")
  found = _OPCODE.search(rest)
  kind = re.search(r"kind=k\w+", rest)
  text = f"{name} {found.group(1) if found else ''}( {kind.group(0) if kind else ''}"
  for category, pattern in _CATEGORIES:
    if pattern.search(text):
      return category
  return "fusion"


def _exclusive(events: list[tuple[float, float, str]]) -> dict[str, float]:
  """Each op's own time (ns) on one line of the trace, its nested ops' time taken out (a
  `while` op's event spans every op of its body, which the line also holds)."""
  own: dict[str, float] = collections.Counter()
  stack: list[list] = []  # [end, name, own time so far]
  for start, duration, name in sorted(events, key=lambda e: (e[0], -e[1])):
    while stack and stack[-1][0] <= start:
      end, done, time_ = stack.pop()
      own[done] += time_
    if stack:
      stack[-1][2] -= duration
    stack.append([start + duration, name, duration])
  for _, done, time_ in stack:
    own[done] += time_
  return own


def _summary(xplane: str, calls: int, steps_per_call: int) -> dict:
  """The device plane's ops summed by name (their own time, nested ops taken out), and by
  category."""
  data = jax.profiler.ProfileData.from_file(xplane)
  # What the trace holds, kept in the summary: the line names differ between backends.
  planes = {plane.name: [line.name for line in plane.lines] for plane in data.planes}
  by_op: dict[str, float] = collections.Counter()
  for plane in data.planes:
    if not plane.name.startswith("/device:") or "CUSTOM" in plane.name:
      continue
    for line in plane.lines:
      if line.name == "XLA Ops":
        by_op.update(_exclusive([(e.start_ns, e.duration_ns, e.name) for e in line.events]))
  total = sum(by_op.values()) or 1.0
  by_category: dict[str, float] = collections.Counter()
  for name, ns in by_op.items():
    by_category[_category(name)] += ns
  per_step = lambda ns: ns / calls / steps_per_call
  return {"device_ms_per_step": per_step(total) / 1e6, "planes": planes,
          "categories": {k: {"share": v / total, "ms_per_step": per_step(v) / 1e6}
                         for k, v in by_category.most_common()},
          "ops": [{"op": name[:_OP_TEXT], "category": _category(name), "share": ns / total,
                   "us_per_step": per_step(ns) / 1e3}
                  for name, ns in by_op.most_common(_SHOWN_OPS)]}


def _print(name: str, summary: dict) -> None:
  print(f"{name}: wall {summary.get('wall_ms_per_step', 0):.3f} ms/step, device ops "
        f"{summary['device_ms_per_step']:.3f} ms/step; " + ", ".join(
            f"{k} {v['share']:.1%}" for k, v in summary["categories"].items()), flush=True)
  for op in summary["ops"]:
    print(f"  {op['share']:6.1%} {op['us_per_step']:9.1f} us  [{op['category']}] "
          f"{op['op'][:_OP_SHOWN]}", flush=True)


def main() -> None:
  args = _args()
  if args.what == "read":  # A trace kept earlier, summed again.
    path = args.xplane
    if path.endswith(".gz"):
      with gzip.open(path) as f, tempfile.NamedTemporaryFile(suffix=".xplane.pb",
                                                           delete=False) as out:
        out.write(f.read())
      path = out.name
    _print(os.path.basename(args.xplane), _summary(path, args.calls, args.steps_per_call))
    return
  name = args.name or args.what
  call, steps_per_call = (_train_calls if args.what == "train" else _decode_calls)(args)
  for _ in range(2):
    call()
  started = time.perf_counter()
  call()
  wall = (time.perf_counter() - started) / steps_per_call
  folder = tempfile.mkdtemp()
  jax.profiler.start_trace(folder)
  for _ in range(args.steps):
    call()
  jax.profiler.stop_trace()
  xplane = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)[0]
  os.makedirs(args.out, exist_ok=True)
  with open(xplane, "rb") as f, gzip.open(os.path.join(args.out, f"{name}.xplane.pb.gz"),
                                          "wb") as out:
    shutil.copyfileobj(f, out)
  summary = {"what": args.what, "sets": args.set, "wall_ms_per_step": wall * 1e3,
             "jax": jax.__version__, "device": jax.devices()[0].device_kind,
             **_summary(xplane, args.steps, steps_per_call)}
  if args.what == "decode":
    summary.update(shape=args.shape, batch=args.batch)
  with open(os.path.join(args.out, f"{name}.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  _print(name, summary)


if __name__ == "__main__":
  main()
