"""SentencePiece models trained for the token stores, and loaded checked: the trainer behind a
`vocabulary.SentencePieceModel` and bin/train_vocab.py.

The models trained here are byte-exact for code: no normalization, every space kept, unknown
characters spelled as byte pieces, so decode(encode(text)) == text for any UTF-8 text without
U+2581 (the character SentencePiece writes a space as). The trainer sees a seeded sample of
the documents, cut into chunks SentencePiece does not skip; the model file (and its sidecar of
settings) is written atomically, never over anything but a model of ours, and of several first
runs one trains under a lock beside the file while the others wait and load it.
"""

from __future__ import annotations

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
from typing import Any, Callable, Iterable, Iterator

from etils import epath

from lingvo_lite import input_files, paths
from lingvo_lite.errors import DataError, UsageError, config_error, shown

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


def check_settings(vocab_size: Any, model_type: Any, prefix: str = "") -> None:
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
    written = input_files.json_value(sidecar.read_text())["sha256"]
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
  check_settings(vocab_size, model_type)
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

def load(path: epath.Path, field: str, value: Any, wanted: Any = None):
  """The SentencePieceProcessor of the model at `path`, checked: it exists, parses, uses
  seqio's ids, and (for `wanted`, a vocabulary.SentencePieceModel) has the size and type asked
  for."""
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

def train_once(path: epath.Path, vocabulary: Any, task_name: str,
               train_texts: Callable[[], Iterable[bytes]]) -> None:
  """Trains the model `vocabulary` (a vocabulary.SentencePieceModel) asks for at `path` unless
  it exists; local paths take a lock beside the file, so of several first runs one trains and
  the others wait for it, then load its model."""

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
