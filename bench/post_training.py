"""The post-training demonstration, end to end as a user runs it (README, "Post-training"):
SmolLM2-135M-Instruct (the packaged Q4_1 GGUF, dequantized) fine-tuned with LoRA on the stdlib
instruction set (chat SFT, loss on the assistant's tokens), then DPO with LoRA on the stdlib
preference pairs, every number measured before and after by the programs and bin/lm_eval.py:

  SFT   validation assistant-token bits/byte (the eval program, the whole split);
        HumanEval pass@1 through the chat template, greedy (lingvo_lite_humaneval_chat, 164:
        the answer begun with the problem's prompt; lingvo_lite_humaneval_chat_whole, 164:
        the model writes the whole function);
        HumanEval pass@1 and pass@10 sampled (lingvo_lite_humaneval_chat_sampled, the first
        --pass10_limit problems, 10 samples each);
        the held-out stdlib functions written exactly, and written as valid Python
        (lingvo_lite_stdlib_chat, the first --stdlib_limit of the validation split).
  DPO   the validation pairs' preference accuracy (log p(chosen) > log p(rejected)) of the
        SFT model and of the DPO model, and the DPO model's reward accuracy and margin
        against its reference (the SFT model), from the eval program.

Each phase is one command of the project's CLI in a child process (its wall time and peak
RSS recorded; lm_eval's phases keep every completion in WORK/PHASE/*/samples_*.jsonl); its
result is written to OUT/results.json as soon as it ends, and a phase already there is not
run again, so the script resumes where a stopped run left off. The training phases run
first, the generation measures after them.

  python bench/post_training.py --out bench/results/DATE/post_training --work /tmp/post

Several hours on 2 cores: SFT (40 steps of 8 x 512 tokens) and DPO (30 steps of 4 x 1,024)
each have their own 30 minutes on a quiet machine; the evaluations take the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
LINGVO = [PYTHON, "-m", "lingvo_lite"]
# The decode cache of the lm_eval runs: 8 slots of 1,024 positions hold a stdlib prompt (at
# most ~450 tokens) and its 512 new ones.
DECODE = "decode.slots=8,decode.cache_length=1024"


def _args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True,
                      help="folder for results.json and each phase's log")
  parser.add_argument("--work", default=None,
                      help="folder for the jobs and exports (default: OUT/work; GBs)")
  parser.add_argument("--sft_steps", type=int, default=40)
  parser.add_argument("--dpo_steps", type=int, default=30)
  parser.add_argument("--pass10_limit", type=int, default=20,
                      help="HumanEval problems sampled 10 times each (164: all)")
  parser.add_argument("--stdlib_limit", type=int, default=40,
                      help="validation functions asked for (133: all)")
  parser.add_argument("--humaneval_limit", type=int, default=None,
                      help="HumanEval problems decoded greedily (default: all 164)")
  parser.add_argument("--phases", default=None,
                      help="comma-separated phases to run (default: all not yet recorded)")
  return parser.parse_args()


def _run(command: list[str], log: str) -> dict:
  """`command` from the checkout's root, its output to `log`: wall seconds, peak RSS (GiB),
  exit code. A failed command stops the bench (its log says why)."""
  env = {**os.environ, "PYTHONPATH": ROOT}
  started = time.perf_counter()
  with open(log, "w", encoding="utf-8") as out:
    process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    _, status, usage = os.wait4(process.pid, 0)
  seconds = time.perf_counter() - started
  code = os.waitstatus_to_exitcode(status)
  if code != 0:
    sys.exit(f"post_training: {' '.join(command)} exited {code}; see {log}")
  return {"seconds": round(seconds, 1), "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2),
          "command": " ".join(command[1:] if command[0] == PYTHON else command)}


def _eval_metrics(job: str, name: str = "validation") -> dict:
  """The newest row of the eval program's (or the train program's final eval's) results."""
  for path in (os.path.join(job, "eval", f"eval_{name}.jsonl"),
               os.path.join(job, f"eval_{name}.jsonl")):
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
      return rows[-1]
  raise SystemExit(f"post_training: no eval results under {job}")


def _lm_eval(job: str, task: str, out: str, limit: int | None, exp: str | None = None
             ) -> list[str]:
  model_args = f"job_log_dir={job},{DECODE}" + (f",exp={exp}" if exp else "")
  command = [PYTHON, "bin/lm_eval.py", "--model", "lingvo_lite", "--model_args", model_args,
             "--tasks", task, "--include_path", "tasks/lm_eval", "--apply_chat_template",
             "--confirm_run_unsafe_code", "--output_path", out, "--log_samples"]
  return command + (["--limit", str(limit)] if limit else [])


def _lm_eval_scores(out: str, task: str) -> dict:
  """The metrics of lm_eval's newest results file under `out`."""
  found = []
  for folder, _, names in os.walk(out):
    found += [os.path.join(folder, n) for n in names if n.startswith("results") and
              n.endswith(".json")]
  with open(max(found, key=os.path.getmtime), encoding="utf-8") as f:
    results = json.load(f)["results"][task]
  return {key.split(",")[0]: value for key, value in results.items()
          if "," in key and "stderr" not in key}


def main() -> None:
  args = _args()
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  record_path = os.path.join(out, "results.json")
  record = json.load(open(record_path, encoding="utf-8")) if os.path.exists(record_path) else {}
  chosen = set(args.phases.split(",")) if args.phases else None
  work = os.path.abspath(args.work or os.path.join(out, "work"))
  os.makedirs(work, exist_ok=True)
  job = lambda name: os.path.join(work, name)
  log = lambda name: os.path.join(out, f"{name}.log")
  sft_hf = job("sft_hf")

  def lm_eval_phases(when: str, model_job: str, exp: str | None) -> list:
    """The three lm_eval measures of a model (before or after SFT)."""
    made = []
    for task, limit in (("lingvo_lite_humaneval_chat", args.humaneval_limit),
                        ("lingvo_lite_humaneval_chat_whole", args.humaneval_limit),
                        ("lingvo_lite_humaneval_chat_sampled", args.pass10_limit),
                        ("lingvo_lite_stdlib_chat", args.stdlib_limit)):
      name = f"{task.replace('lingvo_lite_', '')}_{when}"
      made.append((name, lambda name=name, task=task, limit=limit: (
          _run(_lm_eval(model_job, task, job(name), limit, exp=exp), log(name)),
          _lm_eval_scores(job(name), task))))
    return made

  # --- SFT. Before: the pretrained model (a LoRA job's fresh adapters change nothing).
  phases = [("sft_eval_before", lambda: (
      _run([*LINGVO, "--exp=SmolLM2ChatSft", "--mode=eval", f"--job_log_dir={job('sft_before')}"],
           log("sft_eval_before")), _eval_metrics(job("sft_before"))))]
  phases.append(("sft_train", lambda: (  # Its final eval: the validation split after.
      _run([*LINGVO, "--exp=SmolLM2ChatSft", f"--job_log_dir={job('sft')}",
            f"--fdl.train.steps={args.sft_steps}"], log("sft_train")),
      _eval_metrics(job("sft")))))
  phases.append(("sft_export_hf", lambda: (  # The adapters merged: DPO's base.
      _run([*LINGVO, "--mode=export", f"--job_log_dir={job('sft')}", "--export_format=hf",
            f"--export_dir={sft_hf}"], log("sft_export_hf")), {})))
  phases.append(("sft_export_peft", lambda: (
      _run([*LINGVO, "--mode=export", f"--job_log_dir={job('sft')}", "--export_format=peft",
            f"--export_dir={job('sft_peft')}"], log("sft_export_peft")), {})))
  # --- DPO: the reference (and the policy's start) is the SFT model, merged.
  phases.append(("dpo_eval_before", lambda: (
      _run([*LINGVO, "--exp=SmolLM2Dpo", f"--init_from=hf:{sft_hf}", "--mode=eval",
            f"--job_log_dir={job('dpo_before')}"], log("dpo_eval_before")),
      _eval_metrics(job("dpo_before")))))
  phases.append(("dpo_train", lambda: (
      _run([*LINGVO, "--exp=SmolLM2Dpo", f"--init_from=hf:{sft_hf}",
            f"--job_log_dir={job('dpo')}", f"--fdl.train.steps={args.dpo_steps}"],
           log("dpo_train")), _eval_metrics(job("dpo")))))

  # The generation measures last: the training numbers first, whatever happens later.
  phases += lm_eval_phases("before", job("base_lm"), "SmolLM2_135M")
  # After: the adapter job itself, as decode and serve run it.
  phases += lm_eval_phases("after", job("sft"), None)

  for name, run in phases:
    if name in record or (chosen is not None and name not in chosen):
      continue
    print(f"post_training: {name} ...", flush=True)
    measured, metrics = run()
    record[name] = {**measured, "metrics": metrics}
    with open(record_path + ".tmp", "w", encoding="utf-8") as f:
      json.dump(record, f, indent=1, sort_keys=True)
    os.replace(record_path + ".tmp", record_path)
    print(f"post_training: {name}: {measured['seconds']:.0f} s, "
          f"{json.dumps(metrics, sort_keys=True)[:400]}", flush=True)


if __name__ == "__main__":
  main()
