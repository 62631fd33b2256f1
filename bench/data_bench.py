"""Input-pipeline benchmarks of the token store, each a ratio measured side by side in one run.

  PYTHONPATH=. python bench/data_bench.py [--experiment=PyCodeSpTiny] [--steps=200]
      [--synthetic_tokens=0]

1. Loader vs step: tokens/s the loader delivers (one process, prefetch on, the experiment's own
   train data) against tokens/s the experiment's train step consumes (median step time here).
2. Build vs tokenizer: tokens/s of the whole Beam build of the experiment's validation split
   (into a temporary folder, DirectRunner, one worker per core) against tokens/s of
   SentencePiece's raw encode of the same text in this one process.
3. Random access: median latency of one batch of random windows, and the loader's RSS growth
   over the reads, at the experiment's train store and (with --synthetic_tokens=N) at a store of
   N synthetic tokens written by the same shard writer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np
from etils import epath

from lingvo_lite import executor
from lingvo_lite.data import packing, store_build, token_store
from lingvo_lite.data.prefetch import Prefetcher
from lingvo_lite.programs.jitted import JittedSteps


def _rss_mb() -> float:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def step_tokens_per_second(setup, steps: int) -> float:
  jitted = JittedSteps(setup)
  data = setup.train_data
  with jitted.activated():
    state = jitted.init_state()
    batch = jitted.global_batch(data.batch(0))
    for _ in range(2):
      state, metrics = jitted.train_step(state, batch)
    jax.block_until_ready(metrics["loss"])
    times = []
    for _ in range(steps):
      started = time.perf_counter()
      state, metrics = jitted.train_step(state, batch)
      jax.block_until_ready(metrics["loss"])
      times.append(time.perf_counter() - started)
  return data.global_batch_size * data.sequence_length / statistics.median(times)


def loader_tokens_per_second(data, steps: int) -> float:
  data.check()
  prefetcher = Prefetcher(data, 10_000, 10_000 + steps)
  started = time.perf_counter()
  for _ in prefetcher:
    pass
  return steps * data.global_batch_size * data.sequence_length / (time.perf_counter() - started)


def build_vs_encode(data) -> tuple[float, float, int]:
  task = data.task
  import sentencepiece
  vocabulary = task.output_features["targets"].vocabulary
  processor = sentencepiece.SentencePieceProcessor(model_proto=vocabulary.sp_model)
  files = store_build.input_files(task, "validation")
  texts = [open(f, "rb").read().decode("utf-8", "replace") for f in files]
  started = time.perf_counter()
  encoded = sum(len(ids) + 1 for ids in processor.encode(texts))
  encode_rate = encoded / (time.perf_counter() - started)
  with tempfile.TemporaryDirectory() as folder:
    started = time.perf_counter()
    manifest = store_build.build_store(task, "validation", epath.Path(folder) / "validation",
                                       progress=False)
    build_rate = manifest["tokens"] / (time.perf_counter() - started)
  assert manifest["tokens"] == encoded, (manifest["tokens"], encoded)
  return build_rate, encode_rate, encoded


def random_access(store: token_store.TokenStore, rows: int, length: int, reads: int
                  ) -> tuple[float, float]:
  rng = np.random.default_rng(0)
  examples = max(store.num_tokens // length, 1)
  store.read(rng.integers(0, examples, rows) * length, length)
  before, times = _rss_mb(), []
  for _ in range(reads):
    started = time.perf_counter()
    packing.packed_batch(*store.read(rng.integers(0, examples, rows) * length, length))
    times.append(time.perf_counter() - started)
  return statistics.median(times) * 1e3, _rss_mb() - before


def synthetic_store(path: epath.Path, tokens: int, shards: int = 64) -> token_store.TokenStore:
  rng = np.random.default_rng(0)
  per_shard = tokens // shards
  for index in range(shards):
    stream = rng.integers(3, 1024, per_shard).astype(np.uint16)
    cuts = np.cumsum(rng.integers(200, 8000, per_shard // 200))
    token_store.write_shard(path, index, np.split(stream, cuts[cuts < per_shard]), None,
                            np.dtype(np.uint16), {"files": 1})
  ledger = token_store.read_ledger(path)
  return token_store.TokenStore(path, {"schema": token_store.SCHEMA, "has_weights": False,
                                       "shards": [ledger[i] for i in range(shards)]})


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--experiment", default="PyCodeSpTiny")
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--synthetic_tokens", type=int, default=0)
  args = parser.parse_args()
  setup = executor.build_experiment(args.experiment, [])
  data = setup.train_data
  loader = loader_tokens_per_second(data, args.steps)
  step = step_tokens_per_second(setup, min(args.steps, 50))
  print(f"loader {loader:,.0f} tokens/s vs train step {step:,.0f} tokens/s: "
        f"{loader / step:.1f}x ({args.experiment}, batch {data.global_batch_size} x "
        f"{data.sequence_length}, one process, prefetch on)")
  build, encode, tokens = build_vs_encode(data)
  print(f"store build {build:,.0f} tokens/s vs SentencePiece encode {encode:,.0f} tokens/s "
        f"in one process: {build / encode:.2f} ({tokens:,} tokens, validation split, "
        f"{os.cpu_count()} cores)")
  rows, length = data.global_batch_size, data.sequence_length
  latency, growth = random_access(data.store(), rows, length, 300)
  print(f"random batch of {rows} x {length}: {latency:.2f} ms median, RSS +{growth:.1f} MB "
        f"over 300 reads at the train store ({data.store().num_tokens:,} tokens)")
  if args.synthetic_tokens:
    with tempfile.TemporaryDirectory() as folder:
      started = time.perf_counter()
      store = synthetic_store(epath.Path(folder), args.synthetic_tokens)
      written = time.perf_counter() - started
      latency, growth = random_access(store, rows, length, 300)
      print(f"random batch of {rows} x {length}: {latency:.2f} ms median, RSS +{growth:.1f} "
            f"MB over 300 reads at a synthetic store of {store.num_tokens:,} tokens "
            f"(written in {written:.0f} s)")


if __name__ == "__main__":
  main()
