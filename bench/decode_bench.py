"""Greedy decode throughput of lingvo_lite's generator against Hugging Face `generate`.

  cd /work/main && PYTHONPATH=$PWD .venv/bin/python bench/decode_bench.py [--batches 1,8]
      [--repeats 5] [--prompt_length 32] [--new_tokens 256] [--sides hf,lingvo]
      [--hf_python ~/.cache/lingvo_lite/hf-bench-venv/bin/python] [--threads N]
      [--records FILE.jsonl] [--set PATH=VALUE ...]

The same tiny GPT-J on both sides: 4 layers, d_model 256, 4 heads of 64, rotary on all 64
dims of each head (GPT-J's rotary_dim; here = head_dim), MLP 1024 with tanh GELU, vocab 8192,
float32, random weights (7,355,904 parameters on both), 32-token prompts (the same ids on both
sides: numpy `default_rng(seed)`, ids in [1, 8192)), 256 new tokens, greedy, KV cache, at
batch 1 and 8; EOS never ends a row early on either side.
  hf:     Hugging Face `transformers` `GPTJForCausalLM.generate` on torch CPU, in its own
          virtual environment (bench/hf_generate.py --serve, a child process that builds the
          model once and warms each batch size up once; its docstring has the install
          commands and says what it measures).
  lingvo: `lingvo_lite.decode.generator.Generator` (what `--mode=decode` runs) on experiment
          lm.gptj.GptJ6B with its sizes overridden to the ones above (embedding_bias=False,
          which HF's GPT-J lacks), `decode.slots` = the batch, `decode.cache_length` = prompt
          + new tokens, `decode.max_new_tokens` = new tokens, `decode.stop_at_eos=False`
          (other decode.* fields their defaults: a 32-token prompt fills the prefill bucket
          of 32 without padding; 32 steps per call of the jitted loop); parameters from a
          `model.init` with key 0, boxes stripped.
Per batch size and side: generate = wall time of one whole generate call over `batch`
prompts, prefill included; tokens/s = batch * new_tokens / that time. TTFT = wall time of the
same call with max_new_tokens=1 (prefill, the first greedy pick and the call's own overhead).
prefill = the bare prefill: HF a plain forward over the prompt with use_cache=True; lingvo
the largest `Completion.prefill_seconds` of the batch (from the start of its prefill call to
its first token, as the generator times it).

One sitting: both sides warm up first (HF: one untimed run of each kind per batch size;
lingvo: build, init, compile and one untimed run of each kind), then each repeat runs HF b1,
lingvo b1, HF b8, lingvo b8 (--batches in order), the idle side's process blocked, not
spinning. The table gives medians over repeats; the ratio lingvo/HF (of tokens/s, > 1 means
lingvo_lite is faster) is the median of each repeat's own ratio, its two runs seconds apart.
Both sides use every core by default: torch `set_num_threads(--threads)` (default
os.cpu_count()), XLA's CPU thread pool all of them. On a machine whose cores other jobs share,
two-thread torch runs slow down several-fold when a core is taken (its OpenMP threads wait
on each other): check the load averages printed before and after the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HF_VENV = Path.home() / ".cache" / "lingvo_lite" / "hf-bench-venv"
HF_SCRIPT = Path(__file__).resolve().with_name("hf_generate.py")
HF_INSTALL = (f"python3 -m venv {HF_VENV} && {HF_VENV}/bin/pip install torch==2.13.0 "
              "transformers==5.23.0 numpy==2.4.6")
VOCAB = 8192
SIDES = ("hf", "lingvo")
# lm.gptj.GptJ6B shrunk to the bench's shapes; the decode.* fields are the generator's.
GPTJ_SHAPES = (
    "model.vocab_size=8192", "model.num_layers=4", "model.dim=256", "model.num_heads=4",
    "model.head_dim=64", "model.rotary_dim=64", "model.mlp_dim=1024",
    "model.embedding_bias=False", "model.dtype='float32'", "model.param_dtype='float32'",
    "model.scan_layers=False", "model.remat_policy='none'",
    "train_data.vocab_size=8192", "train_data.global_batch_size=8", "eval_data=None",
)


def _parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--prompt_length", type=int, default=32)
  parser.add_argument("--new_tokens", type=int, default=256)
  parser.add_argument("--sides", default="hf,lingvo",
                      help="which sides to run, comma-separated: hf, lingvo")
  parser.add_argument("--hf_python", default=str(HF_VENV / "bin" / "python"),
                      help="the python of the HF virtual environment (bench/hf_generate.py)")
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                      help="torch intra-op threads on the HF side (default: os.cpu_count())")
  parser.add_argument("--seed", type=int, default=0, help="the prompts' seed (both sides)")
  parser.add_argument("--records", help="also write every measurement as JSON lines here")
  parser.add_argument("--set", action="append", default=[],
                      help="extra PATH=VALUE override of the lingvo_lite config (repeatable)")
  args = parser.parse_args()
  try:
    args.batches = [int(b) for b in args.batches.split(",")]
  except ValueError:
    parser.error(f"--batches: {args.batches!r} is not comma-separated numbers")
  args.sides = [s for s in args.sides.split(",") if s]
  if not args.sides or any(s not in SIDES for s in args.sides):
    parser.error(f"--sides: each of {', '.join(SIDES)}, comma-separated")
  if min(*args.batches, args.repeats, args.prompt_length, args.new_tokens, args.threads) < 1:
    parser.error("--batches, --repeats, --prompt_length, --new_tokens and --threads must be "
                 "at least 1")
  return args


def prompts(seed: int, batch: int, prompt_length: int) -> np.ndarray:
  """The same draw as bench/hf_generate.py's `prompts`."""
  return np.random.default_rng(seed).integers(1, VOCAB, (batch, prompt_length), dtype=np.int32)


# ----------------------------------------------------------------------------- HF side


class _HfProcess:
  """bench/hf_generate.py --serve in the HF venv: one request line in, JSON lines out."""

  def __init__(self, args: argparse.Namespace):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # Standalone: no lingvo_lite.
    self.proc = subprocess.Popen(
        [args.hf_python, str(HF_SCRIPT), "--serve", f"--threads={args.threads}",
         f"--seed={args.seed}", f"--prompt_length={args.prompt_length}",
         f"--new_tokens={args.new_tokens}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    self.info = self._read_one()

  def _read_one(self) -> dict[str, Any]:
    while True:
      line = self.proc.stdout.readline()
      if not line:
        raise RuntimeError(f"bench/hf_generate.py exited (status {self.proc.wait()}) before "
                           "answering; its messages are above")
      if line.startswith("{"):
        return json.loads(line)
      print(line, end="", file=sys.stderr)  # Anything else it prints, passed on.

  def run(self, batch: int, repeats: int) -> list[dict[str, Any]]:
    self.proc.stdin.write(json.dumps({"batch": batch, "repeats": repeats}) + "\n")
    self.proc.stdin.flush()
    records = []
    while not (record := self._read_one()).get("done"):
      records.append(record)
    return records

  def close(self) -> None:
    self.proc.stdin.close()
    self.proc.wait(timeout=60)


# ----------------------------------------------------------------------------- lingvo side

_LINGVO_ASSIGNMENTS: list[str] = []  # --set, applied after GPTJ_SHAPES and the decode.* ones.
_LINGVO_CASES: dict[tuple[int, int, int], Any] = {}
_LINGVO_SEED = 0


class _LingvoCase:
  """One batch size's generator: built, initialized, compiled and warmed up once."""

  def __init__(self, batch: int, prompt_length: int, new_tokens: int):
    import jax
    import jax.numpy as jnp
    from lingvo_lite import executor
    from lingvo_lite.decode.requests import Request
    from lingvo_lite.decode.generator import Generator
    from lingvo_lite.training.train_state import strip_boxes

    sets = [*GPTJ_SHAPES, f"decode.slots={batch}",
            f"decode.cache_length={prompt_length + new_tokens}",
            f"decode.max_new_tokens={new_tokens}", "decode.stop_at_eos=False",
            *_LINGVO_ASSIGNMENTS]
    self.setup = executor.build_experiment("lm.gptj.GptJ6B", sets)
    tokens = jnp.zeros((1, prompt_length), jnp.int32)
    params = strip_boxes(jax.jit(self.setup.model.init)(jax.random.key(0), tokens)["params"])
    self.num_params = sum(leaf.size for leaf in jax.tree.leaves(params))
    self.generator = Generator(self.setup, params)
    ids = prompts(_LINGVO_SEED, batch, prompt_length)

    def requests(max_new_tokens: int) -> list:
      return [Request(source="bench", prompt_ids=tuple(int(t) for t in row),
                      max_new_tokens=max_new_tokens, temperature=0.0) for row in ids]

    self.batch, self.new_tokens = batch, new_tokens
    self.full, self.first = requests(new_tokens), requests(1)
    self.generate(self.full)  # Compiles prefill and decode.
    self.generate(self.first)

  def generate(self, requests: list) -> tuple[float, list]:
    started = time.perf_counter()
    completions = self.generator.generate(requests)
    seconds = time.perf_counter() - started
    want = requests[0].max_new_tokens
    lengths = sorted({len(c.completion_ids) for c in completions})
    if len(completions) != len(requests) or lengths != [want]:
      raise RuntimeError(f"lingvo_lite generated {len(completions)} completions of lengths "
                         f"{lengths}, not {len(requests)} of {want}: did a row stop early?")
    return seconds, completions


def _lingvo_run(batch: int, prompt_length: int, new_tokens: int,
                repeats: int) -> list[dict[str, Any]]:
  """`repeats` x (generate, ttft, prefill) records of lingvo_lite's generator, as
  bench/hf_generate.py's; the first call at a shape builds and warms its case (untimed), so
  `repeats=0` only warms up."""
  key = (batch, prompt_length, new_tokens)
  if key not in _LINGVO_CASES:
    _LINGVO_CASES[key] = _LingvoCase(batch, prompt_length, new_tokens)
  case = _LINGVO_CASES[key]
  common = {"side": "lingvo", "batch": batch, "prompt_length": prompt_length,
            "new_tokens": new_tokens}
  records = []
  for repeat in range(repeats):
    seconds, completions = case.generate(case.full)
    records.append({
        **common, "kind": "generate", "repeat": repeat, "seconds": seconds,
        "tokens_per_s": batch * new_tokens / seconds,
        "prefill_seconds_max": max(c.prefill_seconds for c in completions),
        "decode_seconds_max": max(c.decode_seconds for c in completions)})
    seconds, completions = case.generate(case.first)
    records.append({**common, "kind": "ttft", "repeat": repeat, "seconds": seconds})
    records.append({**common, "kind": "prefill", "repeat": repeat,
                    "seconds": max(c.prefill_seconds for c in completions)})
  return records


# ----------------------------------------------------------------------------- table


def _series(records: list[dict], side: str, batch: int, kind: str) -> list[dict]:
  return sorted((r for r in records if (r["side"], r["batch"], r["kind"]) == (side, batch, kind)),
                key=lambda r: r["sitting"])


def _median(values: list[float], fmt: str) -> str:
  return format(statistics.median(values), fmt) if values else "-"


def _row(records: list[dict], batch: int) -> list[str]:
  hf = _series(records, "hf", batch, "generate")
  ours = _series(records, "lingvo", batch, "generate")
  ratios = [o["tokens_per_s"] / h["tokens_per_s"] for h, o in zip(hf, ours)]
  ms = lambda side, kind: [1e3 * r["seconds"] for r in _series(records, side, batch, kind)]
  return [str(batch), _median([r["tokens_per_s"] for r in hf], ",.0f"),
          _median([r["tokens_per_s"] for r in ours], ",.0f"), _median(ratios, ".2f"),
          _median(ms("hf", "ttft"), ".1f"), _median(ms("lingvo", "ttft"), ".1f"),
          _median(ms("hf", "prefill"), ".1f"), _median(ms("lingvo", "prefill"), ".1f")]


def main() -> None:
  global _LINGVO_SEED
  args = _parse_args()
  _LINGVO_ASSIGNMENTS.extend(args.set)
  _LINGVO_SEED = args.seed
  if "hf" in args.sides and not os.access(args.hf_python, os.X_OK):
    sys.exit(f"decode_bench: no HF python at {args.hf_python}; create it with: {HF_INSTALL} "
             "(see bench/hf_generate.py), or pass --hf_python, or --sides=lingvo")
  load = os.getloadavg()
  hf = _HfProcess(args) if "hf" in args.sides else None
  about = [f"{os.cpu_count()} cores", f"load average {load[0]:.2f}"]
  if hf is not None:
    about.insert(0, f"HF: torch {hf.info['torch']}, transformers {hf.info['transformers']}, "
                    f"{hf.info['threads']} threads, {hf.info['params']:,} params, "
                    f"{hf.info['attn_implementation']} attention")
  if "lingvo" in args.sides:
    import jax
    about.insert(0, f"lingvo_lite: jax {jax.__version__} on {jax.device_count()} "
                    f"{jax.devices()[0].device_kind} device(s)")
  print("; ".join(about), file=sys.stderr, flush=True)

  def run(side: str, batch: int, repeats: int) -> list[dict]:
    if side == "hf":
      return hf.run(batch, repeats)
    return _lingvo_run(batch, args.prompt_length, args.new_tokens, repeats)

  records: list[dict] = []
  try:
    for batch in args.batches:  # Warm-ups, untimed: compiles stay out of the sitting.
      for side in args.sides:
        started = time.perf_counter()
        run(side, batch, 0)
        print(f"{side} batch {batch}: warmed up in {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)
    for repeat in range(args.repeats):
      for batch in args.batches:
        for side in args.sides:
          for record in run(side, batch, 1):
            record.update(repeat=repeat, sitting=len(records))
            records.append(record)
          done = {r["kind"]: r for r in records[-3:]}
          print(f"  repeat {repeat + 1} {side} b{batch}: "
                f"{done['generate']['tokens_per_s']:,.0f} tokens/s, ttft "
                f"{1e3 * done['ttft']['seconds']:.1f} ms, prefill "
                f"{1e3 * done['prefill']['seconds']:.1f} ms", file=sys.stderr, flush=True)
  finally:
    if hf is not None:
      hf.close()
  if args.records:
    with open(args.records, "w") as f:
      for record in records:
        f.write(json.dumps(record) + "\n")

  print(f"\nGreedy decode, tiny GPT-J (4 x 256, 4 heads of 64, vocab 8192, float32), "
        f"{args.prompt_length}-token prompts + {args.new_tokens} new tokens, KV cache: medians "
        f"of {args.repeats} alternating repeats on {os.cpu_count()} cores (load average "
        f"{load[0]:.2f} at start, {os.getloadavg()[0]:.2f} at the end). tokens/s = batch x "
        "new tokens / wall time of one generate call (prefill included); lingvo/HF is the "
        "median of each repeat's own ratio; TTFT = the call with max_new_tokens=1; prefill "
        "= HF's bare forward over the prompt, lingvo's largest Completion.prefill_seconds; "
        "times in ms.\n")
  print("| batch | HF tokens/s | lingvo tokens/s | lingvo/HF | HF TTFT | lingvo TTFT | "
        "HF prefill | lingvo prefill |")
  print("|---:|---:|---:|---:|---:|---:|---:|---:|")
  for batch in args.batches:
    print("| " + " | ".join(_row(records, batch)) + " |")


if __name__ == "__main__":
  main()
