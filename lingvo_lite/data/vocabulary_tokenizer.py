"""A task's vocabulary as a `tokenizers` tokenizer, so an export carries tokenizer files.

A pretrained tokenizer already is one (data/pretrained_tokenizer.py). The two vocabularies
lingvo_lite makes itself convert (tests/data/test_vocabulary_tokenizer.py compares whole splits):

- Bytes (seqio's ByteVocabulary: PAD 0, EOS 1, UNK 2, byte b is id b + 3): a BPE model with no
  merges whose only pieces are the 256 byte tokens `<0x00>`..`<0xFF>`, so every character falls
  back to its UTF-8 bytes.
- A SentencePiece unigram model: its pieces and scores in a `tokenizers` Unigram model with
  SentencePiece's byte fallback, Viterbi over the whole text as SentencePiece's unigram encoder
  does (no pre-tokenizer), and a normalizer that does what the model's normalizer spec does
  when that is a plain replacement: identity rules, spaces escaped to U+2581, a leading one
  where add_dummy_prefix, no removal of extra whitespace (what bin/train_vocab.py and
  `SentencePieceModel` train: code keeps its indentation).

Not `tokenizers`' `SentencePieceUnigramTokenizer.from_spm`, which transformers' converters are
built like: it collapses runs of spaces and always adds a leading space, whatever the model's
spec says, and splits at every space before the model sees the text, so a piece of four spaces
of indentation could never be used. And a Unigram model matches every piece it holds, where
SentencePiece's matcher leaves control, unknown and byte pieces out: "</s>" in a text must stay
text. Those pieces (still the special tokens and the byte fallback's targets) get a score
below any path of single-character pieces over the same characters, so no segmentation takes
one, provided each of their characters is a piece (checked; true of code vocabularies).

Where SentencePiece's segmentation is not the best-scoring one, the ids differ: it sums scores
in float32, and between segmentations closer than that resolution (ties such as 16 + 4 spaces
vs 4 + 16, and near-ties deep in a long document, whose running sum has lost the third
decimal) its pick follows the rounding, which `tokenizers`' float64 sums cannot repeat. There
the text is the same and this tokenizer's segmentation scores at least as high. On the stdlib
validation split: 0.49% of the tokens for the default experiment's 1,024-piece model (2,252 of
460,675), 0.35% for the tests' 512-piece one; the rest id for id.

What does not convert (SentencePiece BPE, user-defined symbols, NFKC rules, extra ids, other
seqio vocabularies) raises NotConvertible naming it: the export writes no tokenizer and says
why.
"""

from __future__ import annotations

from typing import Any

from lingvo_lite.data.pretrained_tokenizer import TokenizerFiles
from lingvo_lite.data.text_vocabulary import TextVocabulary

_SPACE = "\u2581"  # SentencePiece's escaped space.
_BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
_SEQIO_BYTE_SPECIALS = ("<pad>", "</s>", "<unk>")  # seqio.ByteVocabulary's ids 0, 1, 2.


class NotConvertible(ValueError):
  """The vocabulary has no exact `tokenizers` form here; the message says why."""


def tokenizer_files(vocabulary: Any) -> TokenizerFiles:
  """The tokenizer files of a task's text vocabulary (`data.source.text_vocabulary`: a
  TextVocabulary, or a seqio Vocabulary), or NotConvertible."""
  pretrained = getattr(vocabulary, "tokenizer", None)  # (seqio's SentencePiece has one too.)
  if isinstance(pretrained, TokenizerFiles):
    return pretrained
  processor = getattr(vocabulary, "sentencepiece", None)  # A TextVocabulary's.
  if processor is not None:
    return sentencepiece_files(processor.serialized_model_proto(), "the task's SentencePiece "
                               "model")
  # seqio's classes by name: importing seqio to test them would import TensorFlow.
  kind = type(vocabulary).__name__
  extra_ids = getattr(vocabulary, "extra_ids", 0)
  if kind in ("ByteVocabulary", "SentencePieceVocabulary") and extra_ids:
    raise NotConvertible(f"the task's {kind} has {extra_ids} extra ids")
  if isinstance(vocabulary, TextVocabulary) or kind == "ByteVocabulary":  # Neither: bytes.
    if vocabulary.vocab_size != len(_SEQIO_BYTE_SPECIALS) + 256:
      raise NotConvertible(f"the task's byte vocabulary has {vocabulary.vocab_size} ids, not "
                           f"{len(_SEQIO_BYTE_SPECIALS) + 256}")
    return byte_files()
  if kind == "SentencePieceVocabulary":
    return sentencepiece_files(vocabulary.sp_model, "the task's SentencePiece model")
  raise NotConvertible(f"the task's vocabulary is a {kind}, which has no tokenizers form here")


def byte_files() -> TokenizerFiles:
  """seqio's ByteVocabulary as tokenizer files."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models  # pylint: disable=g-import-not-at-top
  vocab = {token: i for i, token in enumerate(_SEQIO_BYTE_SPECIALS + _BYTE_TOKENS)}
  made = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
  made.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
  made.add_special_tokens([tokenizers.AddedToken(token, special=True, normalized=False)
                           for token in _SEQIO_BYTE_SPECIALS])
  return TokenizerFiles(json=made.to_str(), eos_id=1, bos_id=None, unk_id=2, add_bos=False,
                        chat_template=None, source="bytes (seqio.ByteVocabulary)", pad_id=0)


def sentencepiece_files(sp_model: bytes, source: str) -> TokenizerFiles:
  """A serialized SentencePiece unigram model as tokenizer files, or NotConvertible."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, normalizers  # pylint: disable=g-import-not-at-top
  proto = sentencepiece_model_pb2.ModelProto.FromString(sp_model)
  trainer, spec = proto.trainer_spec, proto.normalizer_spec
  kinds = sentencepiece_model_pb2.ModelProto.SentencePiece.Type
  if trainer.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
    model_type = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(trainer.model_type)
    raise NotConvertible(f"{source} is a SentencePiece {model_type} model (unigram models "
                         "convert)")
  if spec.name != "identity" or spec.precompiled_charsmap:
    raise NotConvertible(f"{source} normalizes with {spec.name!r} rules (identity converts)")
  if spec.remove_extra_whitespaces:
    raise NotConvertible(f"{source} removes extra whitespace (remove_extra_whitespaces)")
  if not trainer.byte_fallback:
    raise NotConvertible(f"{source} has no byte fallback (its unknown characters would not "
                         "round-trip)")
  others = sorted({kinds.Name(p.type) for p in proto.pieces} - {"NORMAL", "CONTROL", "UNKNOWN",
                                                                "BYTE"})
  if others:
    raise NotConvertible(f"{source} has {', '.join(others)} pieces")
  normal = [p for p in proto.pieces if p.type == kinds.NORMAL]
  unmatched = [p.piece for p in proto.pieces if p.type != kinds.NORMAL]
  singles = {p.piece for p in normal if len(p.piece) == 1}
  missing = sorted({(c, piece) for piece in unmatched for c in piece if c not in singles})
  if missing:
    raise NotConvertible(f"{source}: the character {missing[0][0]!r} of its piece "
                         f"{missing[0][1]!r} is no piece of its own (the piece could not be "
                         "kept out of the text's segmentations)")
  # A path of single-character pieces over a control piece's characters scores at least
  # len x the lowest score; one below that for every such piece.
  never = (max(map(len, unmatched), default=0) + 1) * min(
      (p.score for p in normal), default=0.0) - 100.0
  vocab = [(p.piece, p.score if p.type == kinds.NORMAL else never) for p in proto.pieces]
  unknown = [i for i, p in enumerate(proto.pieces) if p.type == kinds.UNKNOWN]
  made = tokenizers.Tokenizer(models.Unigram(vocab, unk_id=unknown[0] if unknown else None,
                                             byte_fallback=True))
  escape = [normalizers.Replace(" ", _SPACE)] if spec.escape_whitespaces else []
  prefix = [normalizers.Prepend(_SPACE)] if spec.add_dummy_prefix else []
  if prefix or escape:
    made.normalizer = normalizers.Sequence(prefix + escape)
  unescape = [decoders.Replace(_SPACE, " ")] if spec.escape_whitespaces else []
  strip = [decoders.Strip(" ", 1, 0)] if spec.add_dummy_prefix else []
  made.decoder = decoders.Sequence(unescape + [decoders.ByteFallback(), decoders.Fuse()] + strip)
  made.add_special_tokens([
      tokenizers.AddedToken(p.piece, special=True, normalized=False)
      for p in proto.pieces if p.type in (kinds.CONTROL, kinds.UNKNOWN)])

  def token_id(number: int) -> int | None:
    return number if 0 <= number < len(proto.pieces) else None

  eos_id = token_id(trainer.eos_id)
  if eos_id is None:
    raise NotConvertible(f"{source} has no EOS piece")
  return TokenizerFiles(json=made.to_str(), eos_id=eos_id, bos_id=token_id(trainer.bos_id),
                        unk_id=token_id(trainer.unk_id), add_bos=False, chat_template=None,
                        source=source, pad_id=token_id(trainer.pad_id))
