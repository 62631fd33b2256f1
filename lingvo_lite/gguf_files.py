"""A GGUF file (llama.cpp's format) opened once per process.

`gguf.GGUFReader` parses every metadata field when it opens a file: for SmolLM2-135M's 49,152
tokens and merges that is seconds of work, and one run reads the same file for the model's
fields (weights/gguf_checkpoint.py), its tokenizer (data/pretrained_tokenizer.py) and its
tensors. `open_reader` keeps the opened reader (the tensors stay memory-mapped, read on demand)
for as long as the file is unchanged: its size and modification time are part of the key.

The reader slices its memory map once for every part of every field (about 250,000 slices for
SmolLM2's tokenizer), and a slice of a `numpy.memmap` runs the subclass's Python hooks each time:
over half of the parse. `_PlainMapReader` slices a plain ndarray view of the same mapping
instead (still zero-copy, the file stays mapped): SmolLM2's file opens in ~1 s, not ~2.7 s.
"""

from __future__ import annotations

import functools
import os
from typing import Any


def open_reader(path: str) -> Any:
  """The `gguf.GGUFReader` of `path` (an existing file); what the reader raises for a file it
  cannot parse propagates, and is not kept."""
  stat = os.stat(path)
  return _open(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _open(path: str, size: int, mtime_ns: int) -> Any:
  del size, mtime_ns  # The key: a rewritten file is opened again.
  return _reader_class()(path)


@functools.cache
def _reader_class() -> type:
  import gguf  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  class _PlainMapReader(gguf.GGUFReader):
    """`gguf.GGUFReader` whose `data` (the file's `numpy.memmap`, which it only slices and
    views) is kept as a plain ndarray over the same memory."""

    @property
    def data(self) -> np.ndarray:
      return self._plain_data

    @data.setter
    def data(self, value: np.ndarray) -> None:
      self._plain_data = value.view(np.ndarray)

  return _PlainMapReader
