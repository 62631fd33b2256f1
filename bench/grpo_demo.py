"""The GRPO demonstration (README, "Reinforcement learning from verifiable rewards"):
SmolLM2-135M-Instruct with LoRA trained by GRPO on procedurally generated arithmetic word
problems (experiments/lm/smollm2_grpo.py), its accuracy on held-out problems measured before
and after by greedy decoding through the project's CLI.

  python bench/grpo_demo.py --out bench/results/DATE/grpo_demo --work /tmp/grpo_demo

Phases, each one command of the CLI in a child process (wall time recorded), each result
written to OUT/results.json as it ends (a phase already there is not run again):

  problems  the train split (2,000) and the held-out split (500) of
            tasks/arithmetic_problems.py (seed 0; disjoint by construction; the experiment's
            difficulty and one-shot system string, its PROBLEM_FLAGS) written by
            bin/make_prompts.py to experiments/lm/smollm2_grpo.py's PROBLEMS_DIR, and the
            first --held_out (200) held-out prompts, rendered with the chat template, as a
            --prompts_file (greedy)
  before    --mode=decode of the untrained policy (the base: new adapters are zero)
  train     the GRPO run (its metrics.jsonl: reward, pass rate, KL, clip fraction, entropy,
            length, rollout seconds per step)
  after     --mode=decode of the trained job's last checkpoint

Accuracy is the `exact_answer` reward's (the tagged number equals the answer), with a Wilson
95% interval; the rise is given with the normal 95% interval of a difference of two
proportions. The training run alone is sized for 30 minutes on 2 idle CPU cores (README,
"GRPO": the estimate and what it was measured from).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
LINGVO = [sys.executable, "-m", "lingvo_lite"]
EXPERIMENT = "--exp=SmolLM2Grpo"
# The README's prompt sets (bin/make_prompts.py, seed 0): the held-out measure is their first
# --held_out problems.
TRAIN_PROBLEMS, HELD_OUT_PROBLEMS = 2000, 500


def _args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="folder for results.json and the logs")
  parser.add_argument("--work", required=True, help="folder for the jobs")
  parser.add_argument("--held_out", type=int, default=200, help="held-out problems")
  parser.add_argument("--extra", action="append", default=[],
                      help="more flags for the train run (e.g. --fdl.train.steps=8)")
  return parser.parse_args()


def _run(name: str, command: list[str], out: str) -> float:
  """Runs `command` in ROOT, its output in OUT/NAME.log; returns its wall seconds."""
  started = time.perf_counter()
  with open(os.path.join(out, f"{name}.log"), "w", encoding="utf-8") as log:
    code = subprocess.call(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                           env={**os.environ, "PYTHONPATH": ROOT})
  if code:
    sys.exit(f"{name}: exit {code}; see {out}/{name}.log")
  return time.perf_counter() - started


def _problems(work: str, held_out: int, out: str) -> dict:
  """Writes the splits with bin/make_prompts.py (the README's sets: an identical file is
  kept) and the prompts file of the first `held_out` held-out problems; returns where they
  are."""
  from experiments.lm import smollm2_grpo  # pylint: disable=import-outside-toplevel
  from experiments.lm.smollm2 import smollm2_gguf  # pylint: disable=import-outside-toplevel
  # pylint: disable-next=import-outside-toplevel
  from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer
  from lingvo_lite.data.prompt_data import PromptData  # pylint: disable=import-outside-toplevel
  from lingvo_lite.data.prompt_source import PromptSource  # pylint: disable=import-outside-toplevel
  folder = smollm2_grpo.PROBLEMS_DIR
  for split, count in (("train", TRAIN_PROBLEMS), ("held_out", HELD_OUT_PROBLEMS)):
    _run(f"problems_{split}", [sys.executable, "bin/make_prompts.py", "--task=arithmetic",
                               f"--split={split}", f"--count={count}", "--seed=0",
                               *smollm2_grpo.PROBLEM_FLAGS, f"--out={folder}/{split}.jsonl"],
         out)
  source = PromptSource(
      prompts=PromptData(files=os.path.join(ROOT, folder, "held_out.jsonl"),
                         prompts_per_step=1, shuffle=False),
      tokenizer=PretrainedTokenizer(path=smollm2_gguf()),
      sequence_length=smollm2_grpo.SEQUENCE_LENGTH)
  records = source.prompts.records[:held_out]
  held = os.path.join(work, "held_out.jsonl")
  prompts = os.path.join(work, "held_out_prompts.jsonl")
  with open(held, "w", encoding="utf-8") as f, open(prompts, "w", encoding="utf-8") as p:
    for record in records:
      f.write(json.dumps(record) + "\n")
      p.write(json.dumps({"prompt_ids": source.prompt_ids(record), "temperature": 0.0,
                          "max_new_tokens": smollm2_grpo.MAX_NEW_TOKENS}) + "\n")
  return {"held_out": held, "prompts": prompts}


def _accuracy(completions: str, held_out: str) -> dict:
  """The exact_answer accuracy of the completions (in the held-out order), Wilson 95%."""
  from lingvo_lite.rewards import registry  # pylint: disable=import-outside-toplevel
  with open(held_out, encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
  with open(completions, encoding="utf-8") as f:
    texts = [json.loads(line)["completion"] for line in f if line.strip()]
  assert len(texts) == len(records), (len(texts), len(records))
  right = sum(registry.score([("exact_answer", 1.0)], r, t).total >= 1.0
              for r, t in zip(records, texts))
  n, p, z = len(records), right / len(records), 1.96
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return {"correct": right, "n": n, "accuracy": p, "interval95": [centre - half, centre + half]}


def main() -> None:
  args = _args()
  os.makedirs(args.out, exist_ok=True)
  os.makedirs(args.work, exist_ok=True)
  path = os.path.join(args.out, "results.json")
  results = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else {}

  def save():
    with open(path, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)

  files = _problems(args.work, args.held_out, args.out)
  job = os.path.join(args.work, "job")
  for phase, command in (
      ("before", [*LINGVO, "--mode=decode", EXPERIMENT, f"--job_log_dir={args.work}/base",
                  f"--prompts_file={files['prompts']}",
                  f"--decode_out={args.work}/before.jsonl"]),
      ("train", [*LINGVO, EXPERIMENT, f"--job_log_dir={job}", *args.extra]),
      ("after", [*LINGVO, "--mode=decode", f"--job_log_dir={job}",
                 f"--prompts_file={files['prompts']}",
                 f"--decode_out={args.work}/after.jsonl"])):
    if phase in results:
      continue
    seconds = _run(phase, command, args.out)
    results[phase] = {"seconds": seconds}
    if phase != "train":
      results[phase].update(_accuracy(f"{args.work}/{phase}.jsonl", files["held_out"]))
    save()
    print(phase, json.dumps(results[phase]), flush=True)
  before, after = results["before"], results["after"]
  rise = after["accuracy"] - before["accuracy"]
  half = 1.96 * math.sqrt(sum(r["accuracy"] * (1 - r["accuracy"]) / r["n"]
                              for r in (before, after)))
  results["rise"] = {"accuracy": rise, "interval95": [rise - half, rise + half],
                     "above_interval": rise - half > 0}
  save()
  print("rise", json.dumps(results["rise"]))


if __name__ == "__main__":
  main()
