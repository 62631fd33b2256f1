"""Eval throughput of lingvo_lite's eval pass against its eval step and the bare forward.

  PYTHONPATH=. python bench/eval_bench.py [--cases tiny:16,tiny:64,small:16,medium:16]
      [--repeats 5] [--seconds 0.5 | --num_batches N] [--no_train] [--set PATH=VALUE ...]

PyCodeTiny's model (and wider, deeper ones) on its validation token store, sequence length 128,
at each case's eval batch (16 is the eval set's own; the train data gets the same batch). For
each case, in one process, each repeat measures every kind below once, the order rotating
from repeat to repeat so that machine noise and cache warmth hit all alike; the table gives
the medians:
  pass:    `evaluation.evaluate_set` over N batches of the real source, what `--mode=eval` and
           the train loop's evals run: data read, host -> device assembly, the eval step, and
           the pull of its sums to the host after every batch;
  step:    the jitted eval step on one batch already on the device, N times, blocking once at
           the end: the device's share of the pass;
  forward: a plain `jax.jit` of `model.apply` to the logits (no loss) on the same batch: the
           floor that the train step's forward costs at these shapes;
  train:   the jitted train step (forward, backward, AdamW update) on the same batch, its
           state kept from step to step since the step donates it;
  read:    `source.batch` alone over the pass's N batches; put: `jitted.global_batch` alone.
Each kind is compiled by one untimed call first, and one whole pass runs untimed, so the
pass's batches are in the page cache, as they are for every eval of a training run after its
first. Tokens are all B x T positions of a batch, padding included, so every kind counts the
same work (the pass's own `tokens_per_s` counts weighted tokens only). "rest" is pass - step -
read - put per batch: mostly the per-batch host sync (`jax.device_get` of the sums), which
also keeps the host from reading the next batch while the device computes. N is the batches
that `--seconds` of eval steps take (2-64), the train steps as many as fill `--seconds`, or
both `--num_batches`. Parameters are a random init: the timing does not depend on them.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time

import jax

from lingvo_lite import executor
from lingvo_lite.on_mesh import evaluation
from lingvo_lite.on_mesh.jitted import JittedSteps

# Model sizes as overrides of PyCodeTiny (4 layers, width 128, byte vocabulary); heads of 64
# wide in the larger ones, where PyCodeTiny's rotary_dim=16 still fits. The table prints the
# exact parameter counts.
SIZES = {
    "tiny": (),
    "small": ("model.num_layers=6", "model.dim=256", "model.num_heads=4"),
    "medium": ("model.num_layers=8", "model.dim=512", "model.num_heads=8"),
}
# The larger batch on the tiny model only: each case costs ~20-30 s of compiles on 2 CPU
# cores, and this default run should stay under ~4 minutes there.
CASES = "tiny:16,tiny:64,small:16,medium:16"
KINDS = ("pass", "step", "forward", "train", "read", "put")


def _parse_cases(text: str) -> list[tuple[str, int]]:
  cases = []
  for case in text.split(","):
    size, _, batch = case.partition(":")
    if size not in SIZES or not batch.isdigit() or int(batch) < 1:
      raise ValueError(f"--cases: {case!r} is not SIZE:BATCH with SIZE one of "
                       f"{', '.join(SIZES)} and BATCH a positive number of examples")
    cases.append((size, int(batch)))
  return cases


def _parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", default=CASES,
                      help="SIZE:BATCH pairs, comma-separated (BATCH examples of 128 tokens)")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--seconds", type=float, default=0.5,
                      help="about how long each measurement runs (picks N and the train steps)")
  parser.add_argument("--num_batches", type=int,
                      help="batches (and train steps) per measurement, fixed")
  parser.add_argument("--no_train", action="store_true", help="skip the train step")
  parser.add_argument("--set", action="append", default=[],
                      help="extra PATH=VALUE override of the config, applied last (repeatable)")
  args = parser.parse_args()
  try:
    args.cases = _parse_cases(args.cases)
  except ValueError as e:
    parser.error(str(e))
  if args.repeats < 1 or args.seconds <= 0 or (args.num_batches or 1) < 1:
    parser.error("--repeats and --num_batches must be at least 1, --seconds positive")
  return args


class _Case:
  """One model at one eval batch size: its jitted steps, device batch and states, and the
  number of batches (`counts`) each kind runs per measurement."""

  def __init__(self, size: str, batch: int, args: argparse.Namespace):
    # The train data gets the eval batch too, so the train step runs at the eval shapes.
    sets = [*SIZES[size], f"eval_data.global_batch_size={batch}",
            f"train_data.global_batch_size={batch}", *args.set]
    self.setup = executor.build_experiment("PyCodeTiny", sets)
    self.jitted = JittedSteps(self.setup)
    self.set_name, self.source = evaluation.largest_set(self.setup)
    model = self.setup.model
    self.kinds = [kind for kind in KINDS if kind != "train" or not args.no_train]
    with self.jitted.activated():
      # Two inits, since the train step donates its state and eval must keep its params.
      self.params = self.jitted.init_state().params
      self.state = self.jitted.init_state() if "train" in self.kinds else None
      self.batch = self.jitted.global_batch(self.source.batch(0))
    self.forward = jax.jit(lambda p, b: model.apply({"params": p}, b["inputs"],
                                                    b["segment_ids"], b["positions"]))
    self.num_params = sum(leaf.size for leaf in jax.tree.leaves(self.params))
    self.tokens_per_batch = self.source.global_batch_size * self.source.sequence_length
    self._warm_up(args)

  def _warm_up(self, args: argparse.Namespace) -> None:
    """Compiles each kind with one batch, then sizes the counts from one timed call."""
    with self.jitted.activated():
      self.measure("pass", 1)  # Compiles the eval step.
      step_s = self.measure("step", 1)
      # At most the split: a longer pass would read some examples twice.
      most = min(64, self.source.examples_per_pass() // self.source.global_batch_size)
      num_batches = min(args.num_batches or max(math.ceil(args.seconds / step_s), 2), most)
      self.counts = {kind: num_batches for kind in self.kinds}
      self.measure("forward", 1)
      if "train" in self.kinds:
        self.measure("train", 1)
        # Its own count: a train step costs several eval steps, and one --seconds of them
        # measures as long as the others do.
        self.counts["train"] = args.num_batches or max(
            math.ceil(args.seconds / self.measure("train", 1)), 1)
      # The whole pass once: its batches' pages of the store come into the page cache, as
      # they are for every eval of a training run after its first.
      self.measure("pass", num_batches)

  def measure(self, kind: str, count: int) -> float:
    """Wall seconds per batch (per step for train) of `count` of `kind`; call it inside
    `jitted.activated()`."""
    jitted = self.jitted
    if kind == "pass":
      source = dataclasses.replace(self.source, num_batches=count)
    elif kind == "put":  # The host arrays of one batch, read outside the timing.
      local = self.source.batch(0)
    started = time.perf_counter()
    if kind == "pass":
      evaluation.evaluate_set(jitted, self.params, source, self.set_name)
    elif kind == "step":
      for _ in range(count):
        sums = jitted.eval_step(jitted.scorer(self.source))(self.params, self.batch)
      jax.block_until_ready(sums)
    elif kind == "forward":
      for _ in range(count):
        logits = self.forward(self.params, self.batch)
      jax.block_until_ready(logits)
    elif kind == "train":
      for _ in range(count):
        self.state, metrics = jitted.train_step(self.state, self.batch)
      jax.block_until_ready(metrics["loss"])
    elif kind == "read":
      for step in range(count):
        self.source.batch(step)
    else:
      for _ in range(count):
        placed = jitted.global_batch(local)
      jax.block_until_ready(placed)
    return (time.perf_counter() - started) / count


def _row(size: str, case: _Case, runs: dict[str, list[float]]) -> list[str]:
  ms = {kind: 1e3 * statistics.median(times) for kind, times in runs.items()}
  rate = {kind: case.tokens_per_batch / (seconds / 1e3) for kind, seconds in ms.items()}

  def median(value) -> float:
    """The median over repeats of `value(kind -> ms of that repeat)`: the kinds of one repeat
    ran seconds apart, under the same load, so their ratios and differences are steadier
    than those of the medians."""
    return statistics.median(value({kind: 1e3 * times[r] for kind, times in runs.items()})
                             for r in range(len(runs["pass"])))

  train = "train" in runs
  source = case.source
  return [size, f"{case.num_params / 1e6:.2f}M",
          f"{source.global_batch_size}x{source.sequence_length}", str(case.counts["pass"]),
          f"{rate['pass']:,.0f}", f"{rate['step']:,.0f}", f"{rate['forward']:,.0f}",
          f"{rate['train']:,.0f}" if train else "-",
          f"{median(lambda t: t['forward'] / t['pass']):.2f}",
          f"{median(lambda t: t['forward'] / t['step']):.2f}",
          f"{median(lambda t: t['forward'] / t['train']):.2f}" if train else "-",
          f"{ms['pass']:.1f}", f"{ms['step']:.1f}", f"{ms['read']:.2f}", f"{ms['put']:.2f}",
          f"{median(lambda t: t['pass'] - t['step'] - t['read'] - t['put']):.1f}",
          f"{median(lambda t: 1 - t['step'] / t['pass']):.1%}"]


def main() -> None:
  args = _parse_args()
  load = os.getloadavg()[0]
  device = f"{jax.device_count()} {jax.devices()[0].device_kind} device(s)"
  print(f"jax {jax.__version__}, {device}, {os.cpu_count()} cores, load average {load:.2f}; "
        f"{args.repeats} repeats", file=sys.stderr, flush=True)
  rows = []
  for size, batch in args.cases:
    started = time.perf_counter()
    case = _Case(size, batch, args)
    print(f"{size} {batch}x128: {case.num_params / 1e6:.2f}M params, counts {case.counts}, "
          f"built and warmed up in {time.perf_counter() - started:.1f} s",
          file=sys.stderr, flush=True)
    runs: dict[str, list[float]] = {kind: [] for kind in case.kinds}
    with case.jitted.activated():
      for repeat in range(args.repeats):
        # Rotating the order, so no kind always follows the same one.
        shift = repeat % len(case.kinds)
        for kind in case.kinds[shift:] + case.kinds[:shift]:
          runs[kind].append(case.measure(kind, case.counts[kind]))
        print(f"  repeat {repeat + 1}: " + ", ".join(
            f"{kind} {1e3 * runs[kind][-1]:.1f}" for kind in case.kinds) + " ms/batch",
              file=sys.stderr, flush=True)
    rows.append(_row(size, case, runs))
    del case  # Frees its device buffers before the next case allocates its own.

  print(f"\nEval pass vs eval step vs forward, PyCodeTiny's validation store: medians of "
        f"{args.repeats} rotating repeats, jax {jax.__version__} on {device}, "
        f"{os.cpu_count()} cores (load average {load:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at the end). Rates in tokens/s, all B x T positions; "
        "times in ms per batch; the ratios (of rates), rest = pass - step - read - put (the "
        "per-batch host sync) and host share = 1 - step / pass are medians over repeats of "
        "each repeat's own; train = forward, backward and AdamW update.\n")
  print("| model | params | batch | N | (a) pass tok/s | (b) step tok/s | (c) forward tok/s | "
        "(d) train tok/s | a/c | b/c | d/c | pass ms | step ms | read ms | put ms | "
        "rest ms | host share |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for row in rows:
    print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
  main()
