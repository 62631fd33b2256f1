"""A pretrained model's tokenizer (data/pretrained_tokenizer.py's `TokenizerFiles`) as a seqio
Vocabulary, for the token stores' seqio tasks. Made on first use: seqio imports TensorFlow,
which nothing else of a pretrained tokenizer needs.
"""

from __future__ import annotations

import functools

import numpy as np

from lingvo_lite.data.pretrained_tokenizer import TokenizerFiles
from lingvo_lite.runtime.tensorflow_import import import_seqio


@functools.lru_cache(maxsize=None)
def seqio_class() -> type:
  """seqio's Vocabulary over a pretrained tokenizer (made on first use: seqio imports
  TensorFlow)."""
  tf, seqio = import_seqio()

  class TokenizerVocabulary(seqio.Vocabulary):
    """A `TokenizerFiles` as a seqio Vocabulary: its ids, EOS, BOS and UNK, no extra ids."""

    def __init__(self, files: TokenizerFiles):
      self.files = files
      self.tokenizer = files  # As TextVocabulary names it.
      super().__init__(extra_ids=0)

    @property
    def eos_id(self) -> int:
      return self.files.eos_id

    @property
    def bos_id(self) -> int | None:
      return self.files.bos_id

    @property
    def unk_id(self) -> int | None:
      return self.files.unk_id

    @property
    def _base_vocab_size(self) -> int:
      return self.files.vocab_size

    def _encode(self, s):
      return self.files.encode(s)

    def _decode(self, ids):
      return self.files.decode(ids)

    def _encode_tf(self, s):
      ids = tf.numpy_function(  # `text` arrives as a 0-d array of bytes.
          lambda text: np.asarray(self.files.encode(np.asarray(text).item()), np.int32), [s],
          tf.int32, stateful=False)
      ids.set_shape([None])
      return ids

    def _decode_tf(self, ids):
      def decode_rows(array):
        rows = array.reshape(-1, array.shape[-1]) if array.ndim else array.reshape(1, 1)
        texts = [self.files.decode(row.tolist()).encode("utf-8") for row in rows]
        return np.asarray(texts, dtype=object).reshape(array.shape[:-1])

      texts = tf.numpy_function(decode_rows, [ids], tf.string, stateful=False)
      texts.set_shape(ids.shape[:-1])
      return texts

    def __eq__(self, other):
      return isinstance(other, TokenizerVocabulary) and other.files == self.files

    def __hash__(self):
      return hash(self.files)

  return TokenizerVocabulary
