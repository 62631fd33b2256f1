"""Builds token stores from local files (or any task) with Apache Beam; prints a summary.

  python bin/build_store.py --format=jsonl --files=train='data/train/*.jsonl' \\
      --files=validation='data/val/*.jsonl' --text_field=text \\
      --vocabulary=sp:1024:unigram --out=stores/mydata
  python bin/build_store.py --task=tasks.pycode.pycode_task --out=stores/pycode_bytes

`--format` names an entry of `FORMATS` (tasks/formats/), which also gives the flags of that
format's settings (`--text_field`, `--vocab_size`, ...). Each split becomes one store,
`OUT/<split>`, which a config reads with `TokenStoreData(task=<the same task>, split=...,
store_dir='OUT/<split>')`. A store that is already there and matches the task is kept; one
that does not is rebuilt. `--runner` and `--pipeline_arg` run the same pipeline on Dataflow,
Flink or Spark (the README's "Data: token stores").
Bad input (a bad flag or --pipeline_arg, a --task that fails to import, raises or returns no
task): one line on stderr, exit 2, before anything runs. Bad data met during the build,
whatever a worker raises, or a write that fails (a full disk): one line, exit 1; a failed build
leaves nothing behind in a folder it made (no partial store, lock file or log).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A data tool: its TensorFlow needs no GPU, and probing for one prints an error line here.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# pylint: disable=g-import-not-at-top,wrong-import-position
from lingvo_lite.errors import UsageError, config_error, one_line
from lingvo_lite import tool_arguments
from lingvo_lite.tool_arguments import ToolArgumentParser
from tasks.formats import FORMATS, all_settings


def _print_error(message: str) -> None:
  print(f"build_store: {one_line(message)}", file=sys.stderr, flush=True)


# Flags that shape a task built from --format/--files; with --task they would be ignored.
_FORMAT_FLAGS = ("format", "vocabulary", *(setting.name for setting in all_settings()))


def _parse(argv: list[str]) -> argparse.Namespace:
  parser = ToolArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--format", choices=list(FORMATS), help="the files' format (with --files)")
  parser.add_argument("--files", action="append", default=[], metavar="SPLIT=GLOB",
                      help="a split's files; repeat for each split")
  parser.add_argument("--task", help="instead of --format/--files: module.function returning "
                      "a seqio Task (called with no arguments)")
  parser.add_argument("--splits", default=None, help="comma-separated splits of --task to "
                      "build (default: all)")
  parser.add_argument("--vocabulary", default=None, help="bytes, a SentencePiece .model "
                      "path, sp:SIZE:unigram|bpe (trained on the train split first), or "
                      "tokenizer:PATH (a pretrained model's own tokenizer: a Hugging Face "
                      "folder, a tokenizer.json or a .gguf file; the chat and preference "
                      "formats render with its chat template)")
  for setting in all_settings():  # None: left out (a default would hide it from the --task check).
    if setting.flag:
      parser.add_argument(f"--{setting.name}", action="store_const", const=True, default=None,
                          help=setting.help)
    else:
      parser.add_argument(f"--{setting.name}", type=setting.type, default=None,
                          help=setting.help)
  parser.add_argument("--out", required=True, help="folder of the stores, one per split")
  parser.add_argument("--workers", type=int, default=None, help="DirectRunner workers "
                      "(default: this process below 64 MB of input, else one per core)")
  parser.add_argument("--pipeline_arg", action="append", default=[],
                      help="a Beam pipeline option, e.g. --pipeline_arg=--runner=DataflowRunner")
  parser.add_argument("--shard_bytes", type=int, default=None,
                      help="input bytes per store shard (default 32 MiB); part of the store's "
                      "key, since it orders the token stream")
  parser.add_argument("--no_progress", action="store_true")
  args = parser.parse_args(argv)
  if args.task:
    given = [f"--{name}" for name in _FORMAT_FLAGS if getattr(args, name) is not None]
    if given or args.files:
      raise UsageError(f"--task: {', '.join(given + ['--files'] * bool(args.files))} would be "
                       "ignored (the task has its own files and vocabulary); give either --task "
                       "or --format with --files")
  elif args.format:
    # A setting of another format (--text_field with --format=text) would be ignored.
    parser.refuse_unread(args, f"--format={args.format}", {
        setting.name: tuple(f"--format={name}" for name, format_ in FORMATS.items()
                            if setting in format_.settings) for setting in all_settings()})
  if args.vocabulary is None:
    args.vocabulary = "bytes"
  for setting in all_settings():
    if getattr(args, setting.name) is None:
      setattr(args, setting.name, setting.default)
  return args


def _vocabulary(text: str):
  from lingvo_lite.data.vocabulary import PretrainedTokenizer, SentencePieceModel
  if text == "bytes":
    return None
  if text.startswith("tokenizer:"):
    path = text[len("tokenizer:"):]
    if not path.strip():
      raise config_error("--vocabulary", text, "names no tokenizer",
                         "e.g. --vocabulary=tokenizer:models/smollm2 (a Hugging Face folder, a "
                         "tokenizer.json or a .gguf file)")
    return PretrainedTokenizer(path=path)
  if text.startswith("sp:"):
    parts = text.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or parts[2] not in ("unigram", "bpe"):
      raise config_error("--vocabulary", text, "is not sp:SIZE:unigram|bpe",
                         "e.g. --vocabulary=sp:1024:unigram")
    return SentencePieceModel(vocab_size=int(parts[1]), model_type=parts[2])
  return text


def _files(pairs: list[str]) -> dict[str, str | list[str]]:
  files: dict[str, list[str]] = {}
  for pair in pairs:
    split, _, pattern = pair.partition("=")
    if not split or not pattern:
      raise config_error("--files", pair, "is not SPLIT=GLOB", "e.g. --files=train='d/*.txt'")
    files.setdefault(split, []).append(pattern)  # Repeated: every pattern counts.
  if not files:
    raise UsageError("--files: give at least one SPLIT=GLOB with --format, or use --task")
  return {split: patterns[0] if len(patterns) == 1 else patterns
          for split, patterns in files.items()}


def _task(args: argparse.Namespace):
  from tasks import deferred
  if args.task:
    if args.format or args.files:
      raise UsageError("--task: give either --task or --format with --files, not both")
    return deferred.load_task(args.task)
  if not args.format:
    raise UsageError("--format: required with --files; valid choices: " + ", ".join(FORMATS))
  files, vocabulary = _files(args.files), _vocabulary(args.vocabulary)
  format_ = FORMATS[args.format]
  settings = {setting.name: getattr(args, setting.name) for setting in format_.settings}
  return format_.read(files, vocabulary, settings)


def main(argv: list[str]) -> int:
  """Builds the stores; returns the exit code, any error printed as one line on stderr. A
  failed write (the manifest on a full disk, say) or Ctrl-C leaves nothing of the unfinished
  store: its lock, log and the folders made for it are gone."""
  return tool_arguments.ended(lambda: _build(argv), _print_error,
                              "interrupted (Ctrl-C); nothing of the unfinished store is left",
                              ", then build again")


def _build(argv: list[str]) -> int:
  args = _parse(argv)
  from lingvo_lite import outputs, paths
  from lingvo_lite.data import (beam_options, preference_data, store_build, store_folders,
                                token_store)
  if args.workers is not None and args.workers < 1:
    raise config_error("--workers", args.workers, "must be at least 1")
  if args.shard_bytes is not None and args.shard_bytes < 1:
    raise config_error("--shard_bytes", args.shard_bytes, "must be at least 1")
  out = paths.resolve(args.out, "--out")
  # Before the task loads (TensorFlow, the user's code): a place no store can be made in.
  fix = "give a folder of the stores (new or existing) where files can be written"
  if not paths.is_remote(str(out)) and os.path.lexists(out) and not os.path.isdir(out):
    raise config_error("--out", args.out, "is a file, not a folder", fix)
  outputs.check_creatable(out / "store", f"--out={args.out!r}", fix)
  store_folders.check_outside_stores(out, "--out", args.out)
  beam_options.check_pipeline_args(args.pipeline_arg)
  task = _task(args)
  splits = args.splits.split(",") if args.splits else list(task.splits)
  unknown = [s for s in splits if s not in task.splits]
  if unknown:
    raise config_error("--splits", args.splits, f"the task has no split {unknown[0]!r}; valid "
                       f"choices: {', '.join(task.splits)}")
  for split in splits:
    path = out / split
    started = time.perf_counter()
    key = store_build.store_key(task, split, args.shard_bytes)
    manifest = token_store.read_manifest(path)
    kept = manifest is not None and token_store.manifest_difference(key, manifest) is None
    if not kept:
      manifest = store_build.build_store(task, split, path, workers=args.workers,
                                         pipeline_args=args.pipeline_arg,
                                         progress=not args.no_progress, key=key)
    source_bytes = sum(s.get("size", 0) for s in manifest["sources"])
    skipped = manifest.get("skipped_records") or {}
    outputs.print_summary(
        f"{split}: {'kept (up to date)' if kept else 'built'} {path}: "
        f"{manifest['documents']:,} documents, {manifest['tokens']:,} tokens "
        f"({manifest['dtype']}), {source_bytes:,} source bytes, "
        f"{len(manifest['shards'])} shards, {time.perf_counter() - started:.1f} s"
        + (f"; {skipped['count']:,} bad records skipped (--skip_bad_records; the first: "
           f"{skipped['first']})" if skipped.get("count") else ""))
    warning = preference_data.equal_pairs_warning(manifest, split)
    if warning:
      print(f"build_store: warning: {warning}", file=sys.stderr, flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
