"""Cost of the train loop's two fault checks: the finiteness check before each save, and the
checksums written when a save is verified.

  python bench/fault_checks_bench.py [--experiment BenchSmall] [--pairs 7] [--steps 20]
                                     [--warmup 10] [--dir DIR] [--set PATH=VALUE ...]

Each timed block trains `--steps` steps the way the train loop does (programs/train/loop.py): a
train step, `poll()`, and every `checkpoint.every_steps` steps (10 here) the finiteness check
`bool(jitted.state_is_finite(state))` and an async orbax save; the block ends by waiting for
its last save (orbax's commit, the checksums, the deletion of old steps), so every block pays
for all of its saves. Three variants differ in one thing each:
  with both   finiteness check on, checksums on (what training does)
  no finite   the finiteness check skipped
  no checks.  a second Checkpointer with `checksums=False`
Same step function, state, batches, save cadence and kind of folder (two sibling folders of
`--dir`, default a new temporary folder, removed at the end; max_to_keep=2).

One round times four blocks: `with both` twice (A/A), `no finite` and `no checksums`, in an
order that rotates and reverses from round to round, so no variant always follows the same one.
Per round: finiteness ratio = mean(with both) / no finite, checksums ratio = mean(with both) /
no checksums, A/A ratio = first with-both block / second. Prints every round, each variant's
median s/step, and last the median ratios with their quartiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
import jax
from absl import logging
from etils import epath

from bench import timed_steps
from lingvo_lite import executor
from lingvo_lite.checkpoints import integrity as checkpoint_integrity
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.on_mesh.jitted import JittedSteps
# pylint: enable=wrong-import-position

_EVERY_STEPS = 10
_MAX_TO_KEEP = 2


def _parse_args() -> argparse.Namespace:
  parser = timed_steps.paired_parser(__doc__, "BenchSmall", steps=20, warmup=10, helps={
      "pairs": "rounds; each times every variant once and `with both` twice",
      "steps": "train steps per timed block (saves every 10 of them)",
      "warmup": "untimed steps each variant runs first (10: one save, compiles all)"})
  parser.add_argument("--dir", default=None,
                      help="parent of the two checkpoint folders (default: a new temp folder)")
  return timed_steps.parse_paired(parser)


class _Bench:
  """One state threaded through every block; a step counter per Checkpointer (orbax wants
  increasing steps), each block starting on a multiple of the save interval, so every
  variant saves at the same places in its blocks."""

  def __init__(self, experiment: str, sets: list[str], parent: epath.Path):
    self.setup = executor.build_experiment(experiment, sets)
    self.jitted = JittedSteps(self.setup)
    settings = self.setup.checkpoint
    self.every = settings.every_steps
    self.checkpointers = {
        True: Checkpointer(parent / "checksums_on", settings),
        False: Checkpointer(parent / "checksums_off",
                            dataclasses.replace(settings, checksums=False)),
    }
    self.next_step = {True: 0, False: 0}
    data = self.setup.train_data
    with self.jitted.activated():
      self.state = self.jitted.init_state()
      # A few distinct batches, built once, cycled through alike by every variant.
      self.batches = [self.jitted.global_batch(data.batch(i)) for i in range(4)]
    self.saves = 0

  def block(self, num_steps: int, finite_check: bool, checksums: bool) -> float:
    """s/step of `num_steps` train-loop steps, the block's saves fully waited for."""
    checkpointer = self.checkpointers[checksums]
    jitted = self.jitted
    step = -(-self.next_step[checksums] // self.every) * self.every  # Next multiple.
    state = self.state
    with jitted.activated():
      started = time.perf_counter()
      for i in range(num_steps):
        state, metrics = jitted.train_step(state, self.batches[i % len(self.batches)])
        step += 1
        checkpointer.poll()
        if step % self.every == 0:
          if finite_check and not bool(jitted.state_is_finite(state)):
            raise RuntimeError(f"the state is not finite at step {step}")
          if checkpointer.save(step, state, metadata=jitted.checkpoint_metadata):
            self.saves += 1
      checkpointer.wait()
      jax.block_until_ready((state, metrics))
      elapsed = time.perf_counter() - started
    self.state, self.next_step[checksums] = state, step
    return elapsed / num_steps

  def direct_costs(self, repeats: int = 5) -> tuple[float, float]:
    """Median seconds of one finiteness check (state ready) and of one `write_checksums` of
    the newest saved step: the per-save costs the blocks' ratios should show."""
    jax.block_until_ready(self.state)
    finite, checksums = [], []
    with self.jitted.activated():
      for _ in range(repeats):
        started = time.perf_counter()
        bool(self.jitted.state_is_finite(self.state))
        finite.append(time.perf_counter() - started)
    # A step of the checksums-off folder: it has none yet; each one written is removed again.
    off = self.checkpointers[False]
    step_dir = off._directory / str(off.all_steps()[-1])  # pylint: disable=protected-access
    for _ in range(repeats):
      started = time.perf_counter()
      checkpoint_integrity.write_checksums(step_dir, off.all_steps()[-1], off.job)
      checksums.append(time.perf_counter() - started)
      (step_dir / checkpoint_integrity.CHECKSUMS_FILE).unlink()
    return statistics.median(finite), statistics.median(checksums)

  def close(self) -> None:
    for checkpointer in self.checkpointers.values():
      checkpointer.close()


# name -> (finiteness check, checksums); "with both 2" is the A/A twin of "with both".
_VARIANTS = {"with both": (True, True), "no finite": (False, True),
             "no checksums": (True, False), "with both 2": (True, True)}


def _quartiles(values: list[float]) -> tuple[float, float]:
  q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
  return q[0], q[2]


def _summary(name: str, ratios: list[float]) -> str:
  median = statistics.median(ratios)
  low, high = _quartiles(ratios)
  return (f"{name}: {median - 1:+.1%} (median ratio {median:.3f}, quartiles "
          f"{low:.3f}-{high:.3f}, {len(ratios)} pairs)")


def main() -> None:
  args = _parse_args()
  logging.set_verbosity(logging.ERROR)  # Not a line per deleted old step.
  sets = [f"checkpoint.every_steps={_EVERY_STEPS}", f"checkpoint.max_to_keep={_MAX_TO_KEEP}",
          *args.set]
  parent = tempfile.mkdtemp(prefix="fault_checks_bench_", dir=args.dir)
  try:
    bench = _Bench(args.experiment, sets, epath.Path(parent))
    setup = bench.setup
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(bench.state))
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].device_kind} "
          f"device(s); {args.experiment} with {sets}; state {state_bytes / 2**20:.1f} MiB; "
          f"saves every {setup.checkpoint.every_steps} steps (async "
          f"{setup.checkpoint.async_save}, max_to_keep {setup.checkpoint.max_to_keep}) in "
          f"{parent}; {args.steps} steps per block")
    for name, (finite_check, checksums) in list(_VARIANTS.items())[:3]:
      bench.block(args.warmup, finite_check, checksums)  # Compile, first saves, warm caches.

    names = list(_VARIANTS)
    times: dict[str, list[float]] = {name: [] for name in names}
    finite_ratios, checksum_ratios, aa_ratios = [], [], []
    for round_index in range(args.pairs):
      shift = round_index % len(names)
      order = names[shift:] + names[:shift]
      if round_index % 2:
        order.reverse()
      for name in order:
        times[name].append(bench.block(args.steps, *_VARIANTS[name]))
      both = (times["with both"][-1] + times["with both 2"][-1]) / 2
      finite_ratios.append(both / times["no finite"][-1])
      checksum_ratios.append(both / times["no checksums"][-1])
      aa_ratios.append(times["with both"][-1] / times["with both 2"][-1])
      print(f"round {round_index + 1} ({', '.join(order)}): " +
            ", ".join(f"{name} {times[name][-1]:.4f}" for name in names) +
            f" s/step; finiteness {finite_ratios[-1]:.3f}, checksums "
            f"{checksum_ratios[-1]:.3f}, A/A {aa_ratios[-1]:.3f}")
    finite_s, checksums_s = bench.direct_costs()
    bench.close()
    for name in names:
      print(f"{name}: median {statistics.median(times[name]):.4f} s/step")
    interval_s = setup.checkpoint.every_steps * statistics.median(times["no finite"])
    print(f"timed alone (median of 5, page cache warm): finiteness check {finite_s * 1e3:.1f} "
          f"ms, checksums of one step {checksums_s * 1e3:.1f} ms per save: "
          f"{finite_s / interval_s:.2%} and {checksums_s / interval_s:.2%} of "
          f"{setup.checkpoint.every_steps} steps")
    print(f"{bench.saves} saves in all, {args.steps // setup.checkpoint.every_steps} per block")
    print(_summary("A/A (with both / with both)", aa_ratios))
    print(_summary("finiteness check", finite_ratios))
    print(_summary("checksums at commit", checksum_ratios))
  finally:
    shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
  main()
