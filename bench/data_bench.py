"""Input-pipeline benchmarks of the token store, each a ratio measured side by side in one run.

  PYTHONPATH=. python bench/data_bench.py [--experiment=PyCodeSpTiny] [--steps=200]
      [--synthetic_bytes=500000000]

1. Loader vs step: tokens/s the loader delivers (one process, prefetch on, the experiment's own
   train data) against tokens/s the experiment's train step consumes (median step time here).
2. Build vs tokenizer: tokens/s of the whole Beam build of the experiment's splits (into a
   temporary folder, the default worker policy) and, with --synthetic_bytes, of
   bin/build_store.py over that much generated text (the stdlib's lines, shuffled; one worker
   per core), against tokens/s of SentencePiece's raw encode of the same text in one process.
3. Random access: median latency of one batch of random windows, and the loader's RSS growth
   over the reads, at the experiment's train store and at the generated one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
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
from lingvo_lite.on_mesh.jitted import JittedSteps


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


def encode_rate(model_proto: bytes, files: list[str]) -> tuple[float, int]:
  """Tokens/s of SentencePiece's own encode (C++, one process) over `files`, EOS counted."""
  import sentencepiece
  processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
  tokens, seconds = 0, 0.0
  for file in files:
    with open(file, "rb") as f:
      text = f.read().decode("utf-8")
    started = time.perf_counter()
    tokens += len(processor.encode(text)) + 1
    seconds += time.perf_counter() - started
  return tokens / seconds, tokens


def build_vs_encode(data, split: str) -> tuple[float, float, int, int]:
  """(build tokens/s, encode tokens/s, tokens, workers) for `split` of the data's task, built
  afresh into a temporary folder with the default worker policy."""
  task = data.task
  vocabulary = task.output_features["targets"].vocabulary
  rate, encoded = encode_rate(vocabulary.sp_model, store_build.input_files(task, split))
  with tempfile.TemporaryDirectory() as folder:
    started = time.perf_counter()
    manifest = store_build.build_store(task, split, epath.Path(folder) / split, progress=False)
    build_rate = manifest["tokens"] / (time.perf_counter() - started)
  assert manifest["tokens"] == encoded, (manifest["tokens"], encoded)
  return build_rate, rate, encoded, manifest["build"]["workers"]


def generated_corpus(folder: str, total_bytes: int, files: int = 64) -> list[str]:
  """`files` text files of Python-like text: the stdlib's own lines, shuffled with a seed."""
  from tasks import pycode
  root = pycode.stdlib_dir()
  lines = []
  for document in pycode.read_documents(root, "train"):
    lines.extend(document.decode("utf-8", "replace").splitlines(keepends=True))
  rng = np.random.default_rng(0)
  paths = []
  for index in range(files):
    path = os.path.join(folder, f"part{index:03d}.txt")
    with open(path, "w") as f:
      written = 0
      while written < total_bytes // files:
        chunk = "".join(lines[i] for i in rng.integers(0, len(lines), 20_000))
        f.write(chunk)
        written += len(chunk.encode())
    paths.append(path)
  return paths


def tool_build(files_glob: str, vocabulary: str, out: str) -> float:
  """Seconds of `bin/build_store.py` building the generated corpus (the whole command)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  started = time.perf_counter()
  subprocess.run([sys.executable, os.path.join(root, "bin", "build_store.py"), "--format=text",
                  f"--files=train={files_glob}", f"--vocabulary={vocabulary}", f"--out={out}",
                  "--no_progress"], check=True, env={**os.environ, "PYTHONPATH": root})
  return time.perf_counter() - started


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


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--experiment", default="PyCodeSpTiny")
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--synthetic_bytes", type=int, default=0,
                      help="also build this much generated text with bin/build_store.py")
  args = parser.parse_args()
  setup = executor.build_experiment(args.experiment, [])
  data = setup.train_data
  loader = loader_tokens_per_second(data, args.steps)
  step = step_tokens_per_second(setup, min(args.steps, 50))
  print(f"loader {loader:,.0f} tokens/s vs train step {step:,.0f} tokens/s: "
        f"{loader / step:.1f}x ({args.experiment}, batch {data.global_batch_size} x "
        f"{data.sequence_length}, one process, prefetch on)")
  for split in ("validation", "train"):
    build, encode, tokens, workers = build_vs_encode(data, split)
    print(f"store build {build:,.0f} tokens/s vs SentencePiece encode {encode:,.0f} tokens/s "
          f"in one process: {build / encode:.2f} ({tokens:,} tokens, {split} split, "
          f"{workers} worker(s), {os.cpu_count()} cores)")
  rows, length = data.global_batch_size, data.sequence_length
  latency, growth = random_access(data.store(), rows, length, 300)
  print(f"random batch of {rows} x {length}: {latency:.2f} ms median, RSS +{growth:.1f} MB "
        f"over 300 reads at the train store ({data.store().num_tokens:,} tokens)")
  if args.synthetic_bytes:
    vocabulary = data.task.output_features["targets"].vocabulary
    model = os.path.join(tempfile.gettempdir(), "data_bench_vocab.model")
    with open(model, "wb") as f:
      f.write(vocabulary.sp_model)
    with tempfile.TemporaryDirectory() as folder:
      files = generated_corpus(folder, args.synthetic_bytes)
      encode, tokens = encode_rate(vocabulary.sp_model, files)
      seconds = tool_build(os.path.join(folder, "*.txt"), model, os.path.join(folder, "stores"))
      store = token_store.open_store(epath.Path(folder) / "stores" / "train")
      assert store.num_tokens == tokens, (store.num_tokens, tokens)
      print(f"bin/build_store.py on {args.synthetic_bytes / 1e6:,.0f} MB of generated text: "
            f"{tokens / seconds:,.0f} tokens/s vs SentencePiece encode {encode:,.0f} tokens/s: "
            f"{tokens / seconds / encode:.2f} ({tokens:,} tokens, "
            f"{store.manifest['build']['workers']} workers, {seconds:.0f} s)")
      latency, growth = random_access(store, rows, length, 300)
      print(f"random batch of {rows} x {length}: {latency:.2f} ms median, RSS +{growth:.1f} "
            f"MB over 300 reads at the generated store ({store.num_tokens:,} tokens)")


if __name__ == "__main__":
  main()
