"""Writes a generated prompt set as JSON lines, or checks a prompt set; prints a summary.

  python bin/make_prompts.py --task=arithmetic --split=train --count=2000 --seed=0 \\
      --out=data/arithmetic/train.jsonl
  python bin/make_prompts.py --task=arithmetic --split=held_out --count=500 \\
      --out=data/arithmetic/held_out.jsonl
  python bin/make_prompts.py --task=code --split=train --out=data/code/train.jsonl
  python bin/make_prompts.py --task=arithmetic --form=chat --out=data/arithmetic/sft.jsonl
  python bin/make_prompts.py --check='data/arithmetic/*.jsonl' --rewards=exact_answer

`--task=arithmetic` is tasks/arithmetic_problems.py (multi-step word problems, the answer in a
tag; `--min_steps`, `--max_steps`, `--max_number`, `--operations`: the difficulty;
`--one_shot`: a system string with the format and a worked example), `--task=code`
tasks/code_problems.py (standard-library functions with generated tests;
`--tests_per_problem`). The held-out split never shares a problem with the train split, whatever the seeds. Each record is checked as a
run reads it (lingvo_lite/data/prompt_records.py); the file is written whole or not at all (a
temporary file, then published under its name), and never over a file this tool did not
write: an existing --out that holds exactly this set is kept, anything else there is refused.
`--form=chat` writes each problem with its reference answer as a conversation instead, for SFT
on the same problems (`bin/build_store.py --format=chat`).

`--check` reads files as a run's `PromptData` does: a bad record is one line naming the file
and the line (exit 1), or with `--skip_bad_records` counted in the summary; `--rewards` names
the rewards a run will use, whose fields every record must have. A bad flag is one line on
stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from lingvo_lite.errors import UsageError, config_error, one_line
from lingvo_lite import tool_arguments
from lingvo_lite.tool_arguments import ToolArgumentParser

TASKS = ("arithmetic", "code")


def _print_error(message: str) -> None:
  print(f"make_prompts: {one_line(message)}", file=sys.stderr, flush=True)


def _arithmetic_operations() -> tuple[str, ...]:
  from tasks import arithmetic_problems
  return arithmetic_problems.OPERATIONS


# The flags that only some of what the tool does read (`ToolArgumentParser.refuse_unread`).
_WRITERS = ("--task=arithmetic", "--task=code")
_READERS = {
    **{name: _WRITERS for name in ("split", "seed", "out", "form")},
    **{name: ("--task=arithmetic",) for name in ("count", "min_steps", "max_steps",
                                                  "max_number", "operations", "one_shot")},
    "tests_per_problem": ("--task=code",),
    "skip_bad_records": ("--check",), "rewards": ("--check",),
}


def _parse(argv: list[str]) -> argparse.Namespace:
  parser = ToolArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--task", choices=TASKS, help="the generated set to write (with --out)")
  parser.add_argument("--split", default="train", choices=("train", "held_out"),
                      help="the split: held_out never shares a problem with train")
  parser.add_argument("--seed", type=int, default=0, help="chooses the problems (arithmetic) "
                      "or the tests' arguments (code)")
  parser.add_argument("--count", type=int, default=1000, help="arithmetic: problems to write")
  parser.add_argument("--min_steps", type=int, default=2, help="arithmetic: fewest operations")
  parser.add_argument("--max_steps", type=int, default=3, help="arithmetic: most operations")
  parser.add_argument("--max_number", type=int, default=20,
                      help="arithmetic: the largest number a sentence introduces")
  parser.add_argument("--operations", default=",".join(_arithmetic_operations()),
                      help="arithmetic: comma-separated kinds of operation to draw from")
  parser.add_argument("--one_shot", action="store_true", help="arithmetic: give each "
                      "record a system string stating the format, with a worked example")
  parser.add_argument("--tests_per_problem", type=int, default=8,
                      help="code: drawn test cases per problem, beside the edge cases")
  parser.add_argument("--out", help="the JSON-lines file to write")
  parser.add_argument("--form", choices=("prompts", "chat"), default="prompts",
                      help="prompts: prompt records, for RL; chat: each problem with its "
                      "reference answer as a conversation, for SFT (build_store.py "
                      "--format=chat)")
  parser.add_argument("--check", action="append", default=[], metavar="GLOB",
                      help="instead of --task: prompt files to check; repeat for more")
  parser.add_argument("--skip_bad_records", action="store_true",
                      help="--check: count bad records instead of stopping at the first")
  parser.add_argument("--rewards", default=None, help="--check: comma-separated rewards a "
                      "run will use, whose fields every record must have")
  args = parser.parse_args(argv)
  if bool(args.task) == bool(args.check):
    raise UsageError("give either --task (with --out) or --check; valid --task choices: "
                     + ", ".join(TASKS))
  parser.refuse_unread(args, f"--task={args.task}" if args.task else "--check", _READERS)
  if args.task and not args.out:
    raise UsageError("--out: required with --task (the JSON-lines file to write)")
  return args


def _generate(args: argparse.Namespace) -> list[dict]:
  if args.task == "arithmetic":
    from tasks import arithmetic_problems
    if args.count < 1:
      raise config_error("--count", args.count, "must be at least 1")
    try:
      return arithmetic_problems.generate(
          args.split, args.count, args.seed, args.min_steps, args.max_steps, args.max_number,
          tuple(kind.strip() for kind in args.operations.split(",") if kind.strip()),
          args.one_shot)
    except ValueError as e:
      raise UsageError(f"--task=arithmetic: {e}") from None
  from tasks import code_problems
  if args.tests_per_problem < 0:
    raise config_error("--tests_per_problem", args.tests_per_problem, "must be at least 0")
  try:
    return code_problems.generate(args.split, args.seed, args.tests_per_problem)
  except ValueError as e:
    raise UsageError(f"--task=code: {e}") from None


def _text(args: argparse.Namespace) -> bytes:
  """The set's JSON lines, each record checked as a run reads it; as conversations with their
  reference answers under --form=chat."""
  from lingvo_lite.data import prompt_records
  records = _generate(args)
  for record in records:  # Our own records: a failure here is a bug of the generator.
    prompt_records.checked_record(record)
  if args.form == "chat":
    records = [{"id": r["id"], "messages": prompt_records.messages_of(r) + [
        {"role": "assistant", "content": r["completion"]}]} for r in records]
  text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
  return text.encode("utf-8")


def _write(args: argparse.Namespace) -> None:
  """Writes the set to --out, never over a file it did not write: an existing file that holds
  exactly this set is kept, any other is refused (the house's rule for outputs)."""
  from etils import epath
  from lingvo_lite import input_files, outputs, paths
  out = paths.resolve(args.out, "--out")
  if paths.is_remote(str(out)):
    raise config_error("--out", args.out, "is not a local path", "write it here, then copy it")
  path, fix = str(out), "give a new path, or move the file away"
  if os.path.lexists(path) and (os.path.islink(path) or not os.path.isfile(path)):
    raise config_error("--out", args.out, "already exists and is not a regular file, and it "
                       "is never replaced", fix)
  outputs.check_creatable(out, f"--out={args.out!r}", fix)
  data = _text(args)
  count = data.count(b"\n")
  kind = "prompt records" if args.form == "prompts" else "conversations"
  summary = f"{count:,} {args.task} {kind} ({args.split}, seed {args.seed})"
  if os.path.lexists(path):
    if input_files.read_bytes(path, f"--out={args.out!r}") != data:
      raise config_error("--out", args.out, "already exists and holds something else (a "
                         "file is never overwritten)", fix)
    print(f"kept {args.out} (up to date): {summary}", flush=True)
    return
  partial = epath.Path(f"{path}.partial-{os.getpid()}")
  with outputs.created_folders(out.parent):
    try:
      partial.write_bytes(data)
      outputs.publish(partial, out)
    finally:
      if os.path.lexists(str(partial)):
        os.remove(str(partial))
  print(f"wrote {summary} to {args.out}", flush=True)


def _check(args: argparse.Namespace) -> None:
  from lingvo_lite.data import prompt_data
  from lingvo_lite.rewards import registry
  specs = [(name.strip(), 1.0) for name in (args.rewards or "").split(",") if name.strip()]
  for index, (name, _) in enumerate(specs):
    registry.reward(name, f"--rewards[{index}]")
  loaded = prompt_data.load(args.check, args.skip_bad_records,
                            registry.required_fields(specs), field="--check")
  print(f"{len(loaded.records):,} prompt records, fingerprint {loaded.fingerprint}"
        + (f"; {loaded.skipped:,} bad records skipped (--skip_bad_records; the first: "
           f"{loaded.first_skipped})" if loaded.skipped else ""), flush=True)


def main(argv: list[str]) -> int:
  """Writes or checks; returns the exit code, any error printed as one line on stderr."""
  def run() -> int:
    args = _parse(argv)
    if args.check:
      _check(args)
    else:
      _write(args)
    return 0
  return tool_arguments.ended(run, _print_error, "interrupted (Ctrl-C)")


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
