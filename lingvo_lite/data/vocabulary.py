"""Vocabularies of the token stores: seqio's byte vocabulary, trained SentencePiece models and
pretrained models' tokenizers.

A task tokenizes with raw bytes (None), an existing SentencePiece `.model` file (a path), a
`SentencePieceModel`, which is trained from the task's training split on first use, or a
`PretrainedTokenizer` (a Hugging Face folder's tokenizer.json or a GGUF file's tokenizer,
data/pretrained_tokenizer.py), which seqio sees as a `TokenizerVocabulary`
(data/tokenizer_vocabulary.py). The trainer of SentencePiece models, and their checked loading,
is data/sentencepiece_training.py. Only
`resolve_vocabulary`, `token_byte_lengths`, `fingerprint` and `task_texts` import seqio (and
so TensorFlow); `vocabulary_facts` says what the first two would, without it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Literal

import numpy as np
from etils import epath

from lingvo_lite import paths
from lingvo_lite.runtime import user_code
from lingvo_lite.data import locations
from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer, TokenizerFiles
from lingvo_lite.data import (pretrained_tokenizer, sentencepiece_training as spm_training,
                              tokenizer_vocabulary)
from lingvo_lite.data.sentencepiece_training import BYTE_VOCAB_SIZE
from lingvo_lite.runtime.tensorflow_import import import_seqio, import_tensorflow
from lingvo_lite.errors import DataError, UsageError, config_error, data_error_from, error_cause


@dataclasses.dataclass(frozen=True)
class SentencePieceModel:
  """A SentencePiece vocabulary that a task names: the model file at `path`, trained from the
  task's training split on first use when the file is absent.

  Attributes:
    path: The `.model` file (written atomically when trained); None puts it under
      `locations.data_root()/vocab/`, named by the task and these settings.
    vocab_size: Pieces in the model (pad 0, EOS 1, UNK 2, 256 byte pieces, then learned).
    model_type: "unigram" or "bpe".
  """
  path: str | None = None
  vocab_size: int = 1024
  model_type: Literal["unigram", "bpe"] = "unigram"


def _model_path(vocabulary: SentencePieceModel, task_name: str) -> epath.Path:
  if vocabulary.path is not None:
    return paths.resolve(vocabulary.path)
  name = f"{task_name}-{vocabulary.model_type}-{vocabulary.vocab_size}.model"
  return locations.data_root() / "vocab" / name


def _seqio():
  return import_seqio()[1]


def _not_a_vocabulary(vocabulary: Any) -> UsageError:
  return config_error("vocabulary", vocabulary, f"is a {type(vocabulary).__name__}",
                      "give None (bytes), a .model path, SentencePieceModel(...) or "
                      "PretrainedTokenizer(path=...)")


def _tokenizer_vocabulary_class() -> type:
  return tokenizer_vocabulary.seqio_class()


def resolve_vocabulary(vocabulary: "SentencePieceModel | str | None", task_name: str,
                       train_texts: Callable[[], Iterable[bytes]]):
  """The seqio Vocabulary a task tokenizes with: None -> seqio.ByteVocabulary(); a path -> that
  SentencePiece model (UsageError naming `vocabulary` if it does not exist); a
  SentencePieceModel -> its file, trained from `train_texts()` first if absent (one trainer at
  a time: a file lock; others wait and load it)."""
  if vocabulary is None:
    return _seqio().ByteVocabulary()
  if isinstance(vocabulary, PretrainedTokenizer):
    return _tokenizer_vocabulary_class()(pretrained_tokenizer.read(vocabulary))
  if isinstance(vocabulary, (str, os.PathLike)):
    path = paths.resolve(vocabulary)
    spm_training.load(path, "vocabulary", vocabulary)
    return _seqio().SentencePieceVocabulary(os.fspath(path))
  if not isinstance(vocabulary, SentencePieceModel):
    raise _not_a_vocabulary(vocabulary)
  spm_training.check_settings(vocabulary.vocab_size, vocabulary.model_type, "vocabulary.")
  path = _model_path(vocabulary, task_name)
  spm_training.train_once(path, vocabulary, task_name, train_texts)
  spm_training.load(path, "vocabulary.path", vocabulary.path or os.fspath(path),
                    wanted=vocabulary)
  return _seqio().SentencePieceVocabulary(os.fspath(path))


def vocabulary_size(vocabulary: "SentencePieceModel | str | None") -> int:
  """The vocabulary's size without TensorFlow (259 for bytes; the model's piece count)."""
  if vocabulary is None:
    return BYTE_VOCAB_SIZE
  if isinstance(vocabulary, SentencePieceModel):
    spm_training.check_settings(vocabulary.vocab_size, vocabulary.model_type, "vocabulary.")
    return vocabulary.vocab_size
  if isinstance(vocabulary, (str, os.PathLike)):
    return spm_training.load(paths.resolve(vocabulary), "vocabulary",
                             vocabulary).GetPieceSize()
  if isinstance(vocabulary, PretrainedTokenizer):
    return pretrained_tokenizer.read(vocabulary).vocab_size
  raise _not_a_vocabulary(vocabulary)


def token_byte_lengths(vocabulary) -> np.ndarray:
  """int32 [vocab_size]: how many UTF-8 bytes each id stands for in the original text (0 for
  pad, EOS and UNK), so eval reports bits per byte of the text.

  Exact for the models trained here; a model with add_dummy_prefix (T5's) drops one space
  per text on decoding, which these lengths still count. seqio's extra ids (sentinels) are 0.
  """
  seqio = _seqio()
  if isinstance(vocabulary, seqio.ByteVocabulary):
    return _byte_token_lengths(vocabulary.vocab_size)
  if isinstance(vocabulary, _tokenizer_vocabulary_class()):
    return vocabulary.files.token_byte_lengths()
  if not isinstance(vocabulary, seqio.SentencePieceVocabulary):
    raise TypeError(f"token_byte_lengths: a {type(vocabulary).__name__} is neither a seqio "
                    "ByteVocabulary nor a SentencePieceVocabulary")
  return _sentencepiece_token_lengths(vocabulary.sp_model, vocabulary.tokenizer,
                                      vocabulary.vocab_size, vocabulary.extra_ids)


def _byte_token_lengths(vocab_size: int) -> np.ndarray:
  lengths = np.zeros(vocab_size, np.int32)
  lengths[3:BYTE_VOCAB_SIZE] = 1
  return lengths


def _sentencepiece_token_lengths(sp_model: bytes, processor: Any, vocab_size: int,
                                 extra_ids: int) -> np.ndarray:
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  lengths = np.zeros(vocab_size, np.int32)
  escaped = sentencepiece_model_pb2.ModelProto.FromString(
      sp_model).normalizer_spec.escape_whitespaces
  for i in range(processor.GetPieceSize() - extra_ids):
    if processor.IsByte(i):
      lengths[i] = 1
    elif not (processor.IsControl(i) or processor.IsUnknown(i) or processor.IsUnused(i)):
      piece = processor.IdToPiece(i)
      lengths[i] = len((piece.replace("\u2581", " ") if escaped else piece).encode("utf-8"))
  return lengths


def fingerprint(vocabulary) -> str:
  """A string that changes whenever the vocabulary's ids would (a store's manifest key)."""
  seqio = _seqio()
  if isinstance(vocabulary, seqio.ByteVocabulary):
    return _byte_fingerprint(vocabulary.vocab_size)
  if isinstance(vocabulary, seqio.SentencePieceVocabulary):
    return _sentencepiece_fingerprint(vocabulary.sp_model, vocabulary.extra_ids)
  if isinstance(vocabulary, seqio.PassThroughVocabulary):  # Pre-tokenized ids, kept as they are.
    return f"passthrough:{vocabulary.vocab_size}"
  if isinstance(vocabulary, _tokenizer_vocabulary_class()):
    return vocabulary.files.fingerprint()
  raise TypeError(f"fingerprint: a {type(vocabulary).__name__} is neither a seqio "
                  "ByteVocabulary, SentencePieceVocabulary nor PassThroughVocabulary")


def _byte_fingerprint(vocab_size: int) -> str:
  return f"bytes:{vocab_size}"


def _sentencepiece_fingerprint(sp_model: bytes, extra_ids: int) -> str:
  # sp_model is the proto as seqio loads it: with its extra-id pieces and normalizer overrides.
  digest = hashlib.sha256(sp_model).hexdigest()
  extra = f"+extra_ids:{extra_ids}" if extra_ids else ""
  return f"sentencepiece:{digest}{extra}"


@dataclasses.dataclass(frozen=True)
class VocabularyFacts:
  """What `fingerprint`, `token_byte_lengths` and `vocab_size` say of the seqio Vocabulary a
  task tokenizes with, read without seqio (whose import is TensorFlow's, ~5 s of CPU), so a
  run whose token stores are built need not import it (lingvo_lite/data/task_facts.py).

  Attributes:
    fingerprint: `fingerprint(vocabulary)`.
    vocab_size: `vocabulary.vocab_size`.
    sp_model: The SentencePiece model as seqio holds it (its proto parsed and serialized
      again); None for raw bytes.
    tokenizer: A pretrained tokenizer's files; None for the other kinds.
  """
  fingerprint: str
  vocab_size: int
  sp_model: bytes | None = None
  tokenizer: TokenizerFiles | None = None

  def token_byte_lengths(self) -> np.ndarray:
    """`token_byte_lengths(vocabulary)`."""
    if self.tokenizer is not None:
      return self.tokenizer.token_byte_lengths()
    if self.sp_model is None:
      return _byte_token_lengths(self.vocab_size)
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    processor = spm.SentencePieceProcessor(model_proto=self.sp_model)
    return _sentencepiece_token_lengths(self.sp_model, processor, self.vocab_size, 0)


def vocabulary_facts(vocabulary: "SentencePieceModel | str | None",
                     task_name: str) -> VocabularyFacts | None:
  """The facts of the seqio Vocabulary that `resolve_vocabulary(vocabulary, task_name, ...)`
  returns, after the same checks (the same one-line errors), without seqio: for None (raw
  bytes), seqio.ByteVocabulary()'s; for a `.model` path, or a SentencePieceModel whose file
  exists, seqio.SentencePieceVocabulary(path)'s (no extra ids). None for a SentencePieceModel
  not trained yet: only resolving it trains it."""
  if vocabulary is None:
    return VocabularyFacts(_byte_fingerprint(BYTE_VOCAB_SIZE), BYTE_VOCAB_SIZE)
  if isinstance(vocabulary, PretrainedTokenizer):
    files = pretrained_tokenizer.read(vocabulary)
    return VocabularyFacts(files.fingerprint(), files.vocab_size, tokenizer=files)
  if isinstance(vocabulary, (str, os.PathLike)):
    path, field, value, wanted = paths.resolve(vocabulary), "vocabulary", vocabulary, None
  elif isinstance(vocabulary, SentencePieceModel):
    spm_training.check_settings(vocabulary.vocab_size, vocabulary.model_type, "vocabulary.")
    path, wanted = _model_path(vocabulary, task_name), vocabulary
    field, value = "vocabulary.path", vocabulary.path or os.fspath(path)
    if not path.exists():
      return None
  else:
    raise _not_a_vocabulary(vocabulary)
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  processor = spm_training.load(path, field, value, wanted=wanted)
  # What seqio's loader does to a model file when it adds no extra ids and no overrides.
  sp_model = sentencepiece_model_pb2.ModelProto.FromString(path.read_bytes()).SerializeToString()
  return VocabularyFacts(_sentencepiece_fingerprint(sp_model, 0), processor.GetPieceSize(),
                         sp_model)


def task_texts(task: Any, split: str) -> Iterator[bytes]:
  """The raw `text` field of `split` of a seqio Task (or DeferredTask), in order, unshuffled.

  The task and split are checked when called (imports TensorFlow); the texts are read as
  they are iterated.

  Raises:
    UsageError: when called: no source, no such split, no 'text' field, or the task's code
      (making it, its source's get_dataset) raised.
    DataError: while iterated: a reader's bad-data message, or whatever else reading raised,
      in one line.
  """
  import_tensorflow()
  name = getattr(task, "name", task)
  source = user_code.call_user_code(lambda: getattr(task, "source", None),
                                             f"task={name!r}: making its source")
  if not callable(getattr(source, "get_dataset", None)):
    raise config_error("task", name, "has no seqio data source",
                       "give a seqio Task or a tasks.deferred.DeferredTask")
  splits = list(getattr(source, "splits", None) or ())
  if splits and split not in splits:
    raise config_error("split", split, f"is not a split of {name}",
                       f"choose from {', '.join(splits)}")
  dataset = user_code.call_user_code(
      source.get_dataset, f"task={name!r}: its source's get_dataset(split={split!r})",
      split=split, shuffle=False)
  spec = getattr(dataset, "element_spec", None)
  if not isinstance(spec, dict) or "text" not in spec:
    fields = ", ".join(sorted(spec)) if isinstance(spec, dict) else type(spec).__name__
    raise config_error("task", name, f"its source has no 'text' field (it has {fields})",
                       "give a task whose source yields raw text as 'text'")

  def texts() -> Iterator[bytes]:
    try:
      yield from dataset.map(lambda example: example["text"]).as_numpy_iterator()
    except GeneratorExit:
      raise  # The reader of the texts stopped early: not a failure.
    except KeyboardInterrupt:
      raise  # Ctrl-C, in this thread (a reader's own exceptions come wrapped by tf.data).
    # The task's reader runs here (inside tf.data): a sys.exit() in it is a failed read too.
    except user_code.USER_CODE_FAILURES as e:  # pylint: disable=broad-except
      found = data_error_from(e)
      if found is not None and str(found).strip():
        raise found from None  # Names the file and the record already.
      raise DataError(f"task {name!r}: reading split {split!r} failed: {error_cause(e)}"
                      ) from None

  return texts()


def padded_vocab_size(size: int, multiple: int = 128) -> int:
  """`size` rounded up to a multiple (GPT-J pads 50257 to 50400): the model's embedding rows."""
  return -(-size // multiple) * multiple
