"""lm-evaluation-harness loglikelihood requests per second on SmolLM2-135M-Instruct, side by
side in one sitting (2 CPU cores): the `lingvo_lite` lm_eval model (every request of a call
packed into rows, scoring/scorer.py) against lm_eval's own `hf` model on transformers' load of
the same GGUF (float32) at batch sizes 1 and 8, on the repository's multiple-choice and
loglikelihood tasks (tasks/lm_eval: 80 + 20 requests), each task set run --repeats times
(the first of each side is a warm-up and not counted: compiles, caches), the sides
alternated. Timed: each model's `loglikelihood` call (what lm_eval asks of a model; its own
bookkeeping, about 2 s a run here, is the same for every side and not counted).

Each side's accuracy is printed too: the same model should score the same.

  python bench/lm_eval_bench.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TASKS = ["lingvo_lite_pycode_choice", "lingvo_lite_pycode_next"]
REQUESTS = 80 + 20  # 20 questions x 4 choices, 20 pairs.


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  import lm_eval  # pylint: disable=g-import-not-at-top
  from lm_eval.tasks import TaskManager  # pylint: disable=g-import-not-at-top
  from experiments.lm.smollm2 import smollm2_gguf  # pylint: disable=g-import-not-at-top
  from lingvo_lite.data import pretrained_tokenizer  # pylint: disable=g-import-not-at-top
  from lingvo_lite.harness import lm_eval_model  # pylint: disable=g-import-not-at-top

  manager = TaskManager(include_path=lm_eval_model.TASK_FOLDER)
  work = tempfile.mkdtemp(prefix="lm_eval_bench_")
  gguf = smollm2_gguf()
  tokenizer_folder = os.path.join(work, "tokenizer")
  os.makedirs(tokenizer_folder)
  pretrained_tokenizer.write_hf_files(pretrained_tokenizer.read(gguf), tokenizer_folder, 8192)

  import lm_eval.models.huggingface as hf  # pylint: disable=g-import-not-at-top
  sides = {
      "lingvo_lite": lm_eval_model.LingvoLiteLM(job_log_dir=os.path.join(work, "smol"),
                                                exp="SmolLM2_135M"),
      "hf_batch_1": hf.HFLM(pretrained=os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                            tokenizer=tokenizer_folder, dtype="float32", device="cpu",
                            batch_size=1),
  }
  sides["hf_batch_8"] = hf.HFLM(pretrained=sides["hf_batch_1"].model,
                                tokenizer=tokenizer_folder, device="cpu", batch_size=8)
  seconds = {name: [] for name in sides}
  timed = {}

  def timing(name, call):
    def timed_call(requests, *rest, **kwargs):
      started = time.perf_counter()
      answers = call(requests, *rest, **kwargs)
      timed[name] = (time.perf_counter() - started, len(requests))
      return answers
    return timed_call

  for name, model in sides.items():
    model.loglikelihood = timing(name, model.loglikelihood)
  accuracy = {}
  for repeat in range(args.repeats + 1):
    for name, model in sides.items():
      results = lm_eval.simple_evaluate(model=model, tasks=TASKS, task_manager=manager,
                                        bootstrap_iters=0)
      assert timed[name][1] == REQUESTS, timed[name]
      if repeat:
        seconds[name].append(timed[name][0])
      accuracy[name] = {task: results["results"][task]["acc,none"] for task in TASKS}
  report = {name: {"median_seconds": round(statistics.median(s), 3),
                   "requests_per_s": round(REQUESTS / statistics.median(s), 1),
                   "acc": accuracy[name]} for name, s in seconds.items()}
  for name in ("hf_batch_1", "hf_batch_8"):
    report[f"lingvo_lite_vs_{name}"] = round(report[name]["median_seconds"]
                                             / report["lingvo_lite"]["median_seconds"], 2)
  print(json.dumps(report, indent=2))


if __name__ == "__main__":
  main()
