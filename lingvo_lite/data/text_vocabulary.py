"""Text to a token store's ids and back, as the task's seqio vocabulary does it, without seqio.

Decoding text needs only the vocabulary's encode, decode and EOS, but seqio's vocabularies
come with seqio, whose import is TensorFlow's (~5 s of CPU: most of a small decode's start).
A task that gives its facts (data/task_facts.py) says which vocabulary it tokenizes with, and
that is enough to do what seqio's ByteVocabulary and SentencePieceVocabulary (no extra ids) and
vocabulary.py's TokenizerVocabulary do, id for id and character for character
(tests/data/test_text_vocabulary.py compares them):

  encode(text)  the ids of `text`, no EOS added: UTF-8 bytes + 3, SentencePiece's ids, or a
                pretrained tokenizer's (BOS first where it adds one);
  decode(ids)   ids at or past the vocabulary's size become UNK (are dropped where it has
                none), everything after the first EOS is dropped, then bytes drop PAD/EOS/UNK
                and undecodable UTF-8, SentencePiece decodes its pieces (UNK as its surface
                form), and a pretrained tokenizer decodes without its special tokens.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from lingvo_lite.data.vocabulary import VocabularyFacts

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2  # seqio's convention for bytes (SentencePiece says its own).
_BYTE_OFFSET = 3  # Byte b is id b + 3, after PAD, EOS and UNK.


class TextVocabulary:
  """A task vocabulary's encode and decode, from its `VocabularyFacts`."""

  def __init__(self, facts: VocabularyFacts):
    self.vocab_size = facts.vocab_size
    self._pieces = None
    self.tokenizer = facts.tokenizer  # A pretrained tokenizer's files, or None.
    if self.tokenizer is not None:
      self.eos_id, self.unk_id = self.tokenizer.eos_id, self.tokenizer.unk_id
    elif facts.sp_model is None:
      self.eos_id, self.unk_id = EOS_ID, UNK_ID
    else:
      import sentencepiece as spm  # pylint: disable=g-import-not-at-top
      self._pieces = spm.SentencePieceProcessor(model_proto=facts.sp_model)
      self.eos_id, self.unk_id = self._pieces.eos_id(), self._pieces.unk_id()
    self.pad_id = PAD_ID

  @property
  def sentencepiece(self):
    """The SentencePiece processor of a SentencePiece vocabulary, else None."""
    return self._pieces

  def encode(self, text: str | bytes) -> list[int]:
    """The ids of `text`, without EOS."""
    if self.tokenizer is not None:
      return self.tokenizer.encode(text)
    if self._pieces is not None:
      return list(self._pieces.EncodeAsIds(text))
    text = text.decode() if isinstance(text, bytes) else text
    return [b + _BYTE_OFFSET for b in text.encode("utf-8")]

  def decode(self, ids: Iterable[int]) -> str:
    """The text of `ids` up to the first EOS."""
    clean = [self.unk_id if int(i) >= self.vocab_size and self.unk_id is not None else int(i)
             for i in ids if self.unk_id is not None or int(i) < self.vocab_size]
    if self.eos_id in clean:
      clean = clean[:clean.index(self.eos_id) + 1]
    if self.tokenizer is not None:
      return self.tokenizer.decode(clean)
    if self._pieces is not None:
      return self._pieces.DecodeIds(clean)
    return _bytes_text(clean)


def _bytes_text(ids: Sequence[int]) -> str:
  data = bytes(i - _BYTE_OFFSET for i in ids if _BYTE_OFFSET <= i < 256 + _BYTE_OFFSET)
  return data.decode("utf-8", errors="ignore")
