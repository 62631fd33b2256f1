"""Vocabularies of the token stores: seqio's byte vocabulary, trained SentencePiece models and
pretrained models' tokenizers.

A task tokenizes with raw bytes (None), an existing SentencePiece `.model` file (a path), a
`SentencePieceModel`, which is trained from the task's training split on first use, or a
`PretrainedTokenizer` (a Hugging Face folder's tokenizer.json or a GGUF file's tokenizer,
data/pretrained_tokenizer.py), which seqio sees as a `TokenizerVocabulary`. The
models trained here are byte-exact for code: no normalization, every space kept, unknown
characters spelled as byte pieces, so decode(encode(text)) == text for any UTF-8 text
without U+2581 (the character SentencePiece writes a space as). Only `resolve_vocabulary`,
`token_byte_lengths`, `fingerprint` and `task_texts` import seqio (and so TensorFlow);
`vocabulary_facts` says what the first two would, without it.

Longer than 300 lines with a reason: a `SentencePieceModel` is trained by the call that resolves it,
so the trainer (sampling, atomic writes, the lock under which one of several first runs trains) and
the resolving of each kind of vocabulary (its size, byte lengths and fingerprint) share one set of
settings, model paths and checks (`_check_settings`, `_load`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import io
import itertools
import json
import os
import random
import sys
import time
import uuid
from typing import Any, Callable, Iterable, Iterator, Literal

import numpy as np
from etils import epath

from lingvo_lite import input_files, paths
from lingvo_lite.runtime import user_code
from lingvo_lite.data import locations
from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer, TokenizerFiles
from lingvo_lite.data import pretrained_tokenizer
from lingvo_lite.runtime.tensorflow_import import import_seqio, import_tensorflow
from lingvo_lite.errors import (DataError, UsageError, config_error, data_error_from,
                                error_cause, shown)

# seqio's convention (pad 0, EOS 1, UNK 2), then byte_fallback's 256 byte pieces.
BYTE_VOCAB_SIZE = 259
MODEL_TYPES = ("unigram", "bpe")
# SentencePiece parses vocab_size as an int32; past a million pieces nothing here is sensible.
MAX_VOCAB_SIZE = 1 << 20
# Documents are cut into pieces of at most this many bytes: SentencePiece silently skips a
# sentence over max_sentence_length (4192 by default: most source files).
_CHUNK_BYTES = 4096
# The trainer sees a seeded sample of this many bytes. Unigram, 1024 pieces, stdlib split,
# 2 cores: 1 MB -> 2.49 validation bytes/token, 2 MB -> 2.53, 4 MB -> 2.53; 3 s, 7 s, 16 s.
_SAMPLE_BYTES = 2_000_000
# Byte-exact code: SentencePiece's defaults turn newlines into spaces and collapse runs of
# spaces. Validation bytes/token at 1024 pieces, unigram / bpe: identity normalization alone
# 1.71 / 1.81; + allow_whitespace_only_pieces (a run of indentation is one piece) 2.44 /
# 2.50; + split_by_unicode_script=False (pieces like "(self):\n") 2.53 / 2.58.
# user_defined_symbols for indentation measured worse (2.40) and would take the ids after
# UNK, where the byte pieces belong. split_by_whitespace=False (pieces like "    return")
# gives BPE 4% more (2.69) for 2x its time (4 s) but unigram 1% for 3x (26 s): BPE only.
# max_sentence_length leaves room for a piece whose bad UTF-8 became 3-byte U+FFFDs.
_SETTINGS = dict(
    normalization_rule_name="identity", remove_extra_whitespaces=False,
    add_dummy_prefix=False, byte_fallback=True, allow_whitespace_only_pieces=True,
    split_by_unicode_script=False, max_sentence_length=4 * _CHUNK_BYTES,
    pad_id=0, eos_id=1, unk_id=2, bos_id=-1)


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


def _check_settings(vocab_size: Any, model_type: Any, prefix: str = "") -> None:
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not (
      BYTE_VOCAB_SIZE < vocab_size <= MAX_VOCAB_SIZE):
    raise config_error(f"{prefix}vocab_size", vocab_size, f"must be an int above "
                       f"{BYTE_VOCAB_SIZE} (pad, EOS, UNK and 256 byte pieces come first) and "
                       f"at most {MAX_VOCAB_SIZE:,}", "e.g. 1024")
  if model_type not in MODEL_TYPES:
    raise config_error(f"{prefix}model_type", model_type, "unknown SentencePiece model type",
                       f"choose from {', '.join(MODEL_TYPES)}")


def _chunks(document: bytes, limit: int) -> Iterator[bytes]:
  """`document` in pieces of at most `limit` bytes, cut after a newline where there is one,
  else before a UTF-8 lead byte (so every piece of valid UTF-8 is valid UTF-8)."""
  start = 0
  while len(document) - start > limit:
    cut = document.rfind(b"\n", start, start + limit) + 1
    if cut <= start:
      cut = start + limit
      while cut > start + 1 and document[cut] & 0xC0 == 0x80:
        cut -= 1
    yield document[start:cut]
    start = cut
  if start < len(document):
    yield document[start:]


def _sample(texts: Iterable[bytes], budget: int) -> tuple[list[str], int, int]:
  """(sentences, documents, bytes): a uniform sample of about `budget` bytes of the pieces of
  `texts`, in their original order. Memory stays O(budget) however long `texts` is: each
  piece gets a seeded random priority and the lowest priorities are kept (bottom-k)."""
  rng, order = random.Random(0), itertools.count()
  heap: list[tuple[float, int, bytes]] = []  # (-priority, order, piece): evict the top.
  documents = total = kept = 0
  for document in texts:
    if isinstance(document, str):
      document = document.encode("utf-8")
    documents += 1
    total += len(document)
    for piece in _chunks(bytes(document), _CHUNK_BYTES):
      heapq.heappush(heap, (-rng.random(), next(order), piece))
      kept += len(piece)
      while kept > budget and len(heap) > 1:
        kept -= len(heapq.heappop(heap)[2])
  pieces = [piece for _, _, piece in sorted(heap, key=lambda entry: entry[1])]
  # A document that is not UTF-8 still trains on its valid parts (byte pieces cover the rest).
  return [piece.decode("utf-8", errors="replace") for piece in pieces], documents, total


def _is_local(path: str | os.PathLike) -> bool:
  return not paths.is_remote(os.fspath(path))


def _writable(path: epath.Path, field: str, value: Any) -> list[epath.Path]:
  """Makes `path`'s folder and proves it writable (a probe file: root passes os.access);
  returns the folders it made, outermost first."""
  made = []
  try:
    if path.is_dir():
      raise config_error(field, value, "is a folder", "give a file path, e.g. vocab/code.model")
    _check_replaceable(path, field, value)
    if _is_local(path):
      folder = path.parent
      while not folder.exists() and folder != folder.parent:
        made.insert(0, folder)
        folder = folder.parent
    path.parent.mkdir(parents=True, exist_ok=True)
    if _is_local(path):
      probe = path.parent / f".{path.name}.probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
      os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
      os.remove(probe)
  except OSError as e:
    _remove_empty(made)
    raise config_error(field, value, f"cannot be written ({e.strerror or e})",
                       "give a path in a writable folder") from None
  return made


def _check_replaceable(path: epath.Path, field: str, value: Any) -> None:
  """Refuses a model path (or its `.json` sidecar's) that holds what this module did not
  write: the one overwrite rule. Its own earlier model, recognized by the sidecar's sha256 of
  it, is replaced (atomically); a file of the user's, a device (`/dev/full`, which the rename
  would replace with a file), a FIFO or a symlink is not.

  Raises:
    UsageError: the path or its sidecar exists, and is not this module's earlier output.
  """
  sidecar = epath.Path(f"{path}.json")
  if not (path.exists() or sidecar.exists()
          or (_is_local(path) and (os.path.lexists(path) or os.path.lexists(sidecar)))):
    return
  fix = "give a new path, or move the file away"
  if _is_local(path) and any(os.path.lexists(p) and not (os.path.isfile(p)
                                                          and not os.path.islink(p))
                             for p in (path, sidecar)):
    raise config_error(field, value, "already exists and is not a regular file, and it is "
                       "never replaced", fix)
  try:
    written = json.loads(sidecar.read_text())["sha256"]
    own = written == hashlib.sha256(path.read_bytes()).hexdigest()
  except (OSError, ValueError, KeyError, TypeError):
    own = False
  if not own:
    raise config_error(field, value, f"already exists, and lingvo_lite did not write it (no "
                       f"{sidecar.name} beside it names this model), so it is never "
                       "overwritten", fix)


def _remove_empty(folders: list[epath.Path]) -> None:
  """Removes the folders a failed write made (innermost first), as long as they are empty."""
  for folder in reversed(folders):
    try:
      folder.rmdir()
    except OSError:
      return


def _write_atomically(path: epath.Path, content: str | bytes) -> None:
  """`paths.write_atomically`, a failed write reported as the DataError of this file."""
  try:
    paths.write_atomically(path, content)
  except OSError as e:
    raise DataError(f"{path}: could not write it ({e.strerror or e})") from None


def _training_error(error: RuntimeError, vocab_size: int) -> Exception:
  # SentencePiece's messages start with the C++ check that failed; the user needs the rest.
  detail = " ".join(str(error).rsplit("] ", 1)[-1].split())
  if "ocabulary size" in detail:
    return config_error("vocab_size", vocab_size, "more pieces than SentencePiece can learn "
                        f"from this text ({detail})", "use a smaller vocab_size or more text")
  return DataError(f"SentencePiece training failed: {detail}")


def train_sentencepiece(texts: Iterable[bytes], output_path: str, vocab_size: int,
                        model_type: str = "unigram") -> dict:
  """Trains a byte-exact SentencePiece model for code and text; writes it atomically.

  Documents are cut into pieces of at most 4 KiB (after a newline where possible), so whole
  files train, and the trainer sees a seeded sample of about 2 MB of them, which bounds its
  time (7 s for 1024 unigram pieces on 2 cores, 4 s for BPE); the same texts give the same
  model. `<output_path>.json` records the settings and the summary.

  Args:
    texts: The documents, UTF-8 bytes (str is encoded).
    output_path: The `.model` file to write; a local path or any etils.epath one.
    vocab_size: Pieces in the model, above 259; exactly this many or an error.
    model_type: "unigram" or "bpe".

  Returns:
    A summary dict (documents, pieces, bytes, seconds, path; sampled_bytes, sentences).

  Raises:
    UsageError: A bad vocab_size or model_type, an output path that cannot be written (both
      before `texts` is read), no text, or more pieces than the text yields.
    DataError: The model could not be written, or SentencePiece failed otherwise.
  """
  _check_settings(vocab_size, model_type)
  path = paths.resolve(output_path)
  made = _writable(path, "output_path", output_path)
  try:
    return _train(texts, path, vocab_size, model_type)
  except BaseException:
    _remove_empty(made)  # A failed training into a new folder leaves no folder behind.
    raise


def _train(texts: Iterable[bytes], path: epath.Path, vocab_size: int, model_type: str) -> dict:
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  start = time.time()
  sentences, documents, total = _sample(texts, _SAMPLE_BYTES)
  if not sentences:
    raise UsageError(f"texts: no text to train a SentencePiece model on ({documents} "
                     "documents, all empty); give a split that has text")
  settings = dict(_SETTINGS, vocab_size=vocab_size, model_type=model_type,
                  split_by_whitespace=model_type != "bpe")
  model = io.BytesIO()
  spm.set_random_generator_seed(0)
  try:
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model,
                                   num_threads=os.cpu_count() or 1, minloglevel=2, **settings)
  except RuntimeError as e:
    raise _training_error(e, vocab_size) from None
  data = model.getvalue()
  pieces = spm.SentencePieceProcessor(model_proto=data).GetPieceSize()
  if pieces != vocab_size:  # hard_vocab_limit makes this an error in the trainer already.
    raise config_error("vocab_size", vocab_size, f"SentencePiece made {pieces} pieces",
                       "use a smaller vocab_size or more text")
  summary = dict(documents=documents, bytes=total, pieces=pieces,
                 seconds=round(time.time() - start, 2), path=os.fspath(path),
                 sampled_bytes=sum(len(s.encode("utf-8")) for s in sentences),
                 sentences=len(sentences))
  sidecar = dict(settings=settings, summary=summary, sentencepiece=spm.__version__,
                 sha256=hashlib.sha256(data).hexdigest())
  # The sidecar first: whoever sees the model file also finds its description.
  _write_atomically(epath.Path(f"{path}.json"),
                    json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
  _write_atomically(path, data)
  return summary


def _load(path: epath.Path, field: str, value: Any, wanted: SentencePieceModel | None = None):
  """The SentencePieceProcessor of the model at `path`, checked: it exists, parses, uses
  seqio's ids, and (for `wanted`) has the size and type asked for."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  try:
    data = input_files.read_bytes(path, f"{field}={shown(value)}", "give a .model file")
  except FileNotFoundError:
    raise config_error(field, value, "no such SentencePiece model file", "train one with "
                       "bin/train_vocab.py or give an existing .model") from None
  except OSError as e:
    raise config_error(field, value, f"cannot be read ({e.strerror or e})",
                       "give a readable .model file") from None
  try:
    processor = spm.SentencePieceProcessor(model_proto=data)
  except (RuntimeError, TypeError):
    raise config_error(field, value, "is not a SentencePiece model", "give a .model file "
                       "(bin/train_vocab.py writes one)") from None
  ids = (processor.pad_id(), processor.eos_id(), processor.unk_id())
  if ids != (0, 1, 2):
    raise config_error(field, value, f"has pad, EOS, UNK ids {ids}, not seqio's (0, 1, 2)",
                       "train it with pad_id=0 eos_id=1 unk_id=2 (bin/train_vocab.py does)")
  if wanted is not None:
    pieces = processor.GetPieceSize()
    proto = sentencepiece_model_pb2.ModelProto.FromString(data)
    kind = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)
    for name, asked, found in (("vocab_size", wanted.vocab_size, pieces),
                               ("model_type", wanted.model_type, kind.lower())):
      if asked != found:
        raise config_error(f"vocabulary.{name}", asked, f"the model at {path} has {found}",
                           f"delete it to train again, or ask for {found!r}")
  return processor


def _model_path(vocabulary: SentencePieceModel, task_name: str) -> epath.Path:
  if vocabulary.path is not None:
    return paths.resolve(vocabulary.path)
  name = f"{task_name}-{vocabulary.model_type}-{vocabulary.vocab_size}.model"
  return locations.data_root() / "vocab" / name


def _train_once(path: epath.Path, vocabulary: SentencePieceModel, task_name: str,
                train_texts: Callable[[], Iterable[bytes]]) -> None:
  """Trains the model at `path` unless it exists; local paths take a lock beside the file,
  so of several first runs one trains and the others wait for it, then load its model."""

  def train() -> None:
    print(f"training SentencePiece ({vocabulary.model_type}, {vocabulary.vocab_size} pieces) "
          f"for {task_name} -> {path} ...", file=sys.stderr, flush=True)
    summary = train_sentencepiece(train_texts(), os.fspath(path), vocabulary.vocab_size,
                                  vocabulary.model_type)
    print(f"trained SentencePiece on {summary['documents']} documents "
          f"({summary['bytes'] / 1e6:.1f} MB, {summary['sampled_bytes'] / 1e6:.1f} MB sampled) "
          f"in {summary['seconds']:.1f} s -> {path}", file=sys.stderr, flush=True)

  if path.exists():
    return
  if not _is_local(path):
    train()
    return
  _writable(path, "vocabulary.path", os.fspath(path))
  with paths.exclusive_lock(f"{path}.lock", f"waiting for another process to train {path} ..."):
    if not path.exists():
      train()


def _seqio():
  return import_seqio()[1]


def _not_a_vocabulary(vocabulary: Any) -> UsageError:
  return config_error("vocabulary", vocabulary, f"is a {type(vocabulary).__name__}",
                      "give None (bytes), a .model path, SentencePieceModel(...) or "
                      "PretrainedTokenizer(path=...)")


def _tokenizer_vocabulary_class() -> type:
  return pretrained_tokenizer.seqio_vocabulary_class()


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
    _load(path, "vocabulary", vocabulary)
    return _seqio().SentencePieceVocabulary(os.fspath(path))
  if not isinstance(vocabulary, SentencePieceModel):
    raise _not_a_vocabulary(vocabulary)
  _check_settings(vocabulary.vocab_size, vocabulary.model_type, "vocabulary.")
  path = _model_path(vocabulary, task_name)
  _train_once(path, vocabulary, task_name, train_texts)
  _load(path, "vocabulary.path", vocabulary.path or os.fspath(path), wanted=vocabulary)
  return _seqio().SentencePieceVocabulary(os.fspath(path))


def vocabulary_size(vocabulary: "SentencePieceModel | str | None") -> int:
  """The vocabulary's size without TensorFlow (259 for bytes; the model's piece count)."""
  if vocabulary is None:
    return BYTE_VOCAB_SIZE
  if isinstance(vocabulary, SentencePieceModel):
    _check_settings(vocabulary.vocab_size, vocabulary.model_type, "vocabulary.")
    return vocabulary.vocab_size
  if isinstance(vocabulary, (str, os.PathLike)):
    return _load(paths.resolve(vocabulary), "vocabulary", vocabulary).GetPieceSize()
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
    _check_settings(vocabulary.vocab_size, vocabulary.model_type, "vocabulary.")
    path, wanted = _model_path(vocabulary, task_name), vocabulary
    field, value = "vocabulary.path", vocabulary.path or os.fspath(path)
    if not path.exists():
      return None
  else:
    raise _not_a_vocabulary(vocabulary)
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  processor = _load(path, field, value, wanted=wanted)
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
