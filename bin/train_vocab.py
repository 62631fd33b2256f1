"""Trains a SentencePiece vocabulary on a task's split and writes it where a config names it.

    python bin/train_vocab.py --task=tasks.pycode.pycode_task --split=train \
        --vocab_size=1024 --model_type=unigram --output=vocab/pycode-unigram-1024.model

`--task` is an import path `module.function`, called with no arguments, that returns a seqio
Task or a tasks.deferred.DeferredTask; the texts are its source's "text" field. The model is
byte-exact for code (lingvo_lite/data/sentencepiece_training.py) and written atomically, with a
`<output>.json` sidecar. A bad flag or value, or a --task that fails to import, raises or
returns no task, is one line on stderr and exit code 2; bad data, or whatever else reading the
texts raises, is one line and exit code 1; Ctrl-C is one line and exit code 130.
"""

import argparse
import os
import sys
from typing import Iterator, NoReturn

# Running the file directly puts bin/ first on sys.path; the repository root is what's needed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# TensorFlow only reads the texts here. Its C++ error lines (a failed cuInit on a machine
# without a GPU, at the first op) would break the one-line error contract; whatever goes
# wrong that matters reaches Python as an exception.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# pylint: disable=g-import-not-at-top,wrong-import-position
from lingvo_lite import outputs
from lingvo_lite.data import sentencepiece_training, vocabulary
from lingvo_lite.errors import DataError, UsageError, one_line, shown
from lingvo_lite.tool_arguments import ToolArgumentParser
from tasks import deferred


# The library names its arguments; the user typed these flags.
_FLAGS = {"output_path": "--output", "vocab_size": "--vocab_size", "model_type": "--model_type",
          "split": "--split", "task": "--task"}


def _fail(message: str, code: int = 2) -> NoReturn:
  print(f"train_vocab: error: {one_line(message)}", file=sys.stderr, flush=True)
  raise SystemExit(code)


def _parser() -> argparse.ArgumentParser:
  parser = ToolArgumentParser(prog="train_vocab.py", description=__doc__.split("\n\n")[0])
  parser.add_argument("--task", required=True,
                      help="module.function returning a seqio Task, e.g. tasks.pycode.pycode_task")
  parser.add_argument("--split", default="train", help="the split to train on")
  parser.add_argument("--vocab_size", type=int, default=1024,
                      help=f"pieces in the model, above {sentencepiece_training.BYTE_VOCAB_SIZE}")
  parser.add_argument("--model_type", default="unigram",
                      help=" or ".join(sentencepiece_training.MODEL_TYPES))
  parser.add_argument("--output", required=True, help="the .model file to write")
  return parser


def main(argv: list[str]) -> int:
  """Trains and writes the model; returns the exit code, any error printed as one line."""
  try:
    _train(argv)
  except SystemExit as e:  # _fail's, or argparse's --help.
    return e.code if isinstance(e.code, int) else 1
  except KeyboardInterrupt:  # Ctrl-C: the folders made for the model are gone (vocabulary).
    print("train_vocab: error: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    return 130
  return 0


def _train(argv: list[str]) -> None:
  try:
    args = _parser().parse_args(argv)
    task = deferred.load_task(args.task)

    def texts() -> Iterator[bytes]:
      # Read only once train_sentencepiece has checked the settings and the output path,
      # so a bad --vocab_size fails before TensorFlow loads.
      yield from vocabulary.task_texts(task, args.split)

    summary = sentencepiece_training.train_sentencepiece(texts(), args.output, args.vocab_size,
                                                         args.model_type)
  except UsageError as e:
    message = str(e)
    field = message.split("=", 1)[0]
    _fail(_FLAGS[field] + message[len(field):] if field in _FLAGS else message)
  except DataError as e:  # Bad data, or whatever else reading the texts raised.
    _fail(str(e), code=1)
  outputs.print_summary(
      f"trained SentencePiece {args.model_type} on {shown(args.task)} {args.split}: "
      f"{summary['documents']} documents, {summary['bytes']} bytes "
      f"({summary['sampled_bytes']} sampled), {summary['pieces']} pieces, "
      f"{summary['seconds']:.1f} s -> {summary['path']}")


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
