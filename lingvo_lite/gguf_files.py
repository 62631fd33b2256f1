"""A GGUF file (llama.cpp's format) opened once per process.

`gguf.GGUFReader` parses every metadata field when it opens a file: for SmolLM2-135M's 49,152
tokens and merges that is seconds of work, and one run reads the same file for the model's
fields (weights/gguf_checkpoint.py), its tokenizer (data/pretrained_tokenizer.py) and its
tensors. `open_reader` keeps the opened reader (the tensors stay memory-mapped, read on demand)
for as long as the file is unchanged: its size and modification time are part of the key.
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
  import gguf  # pylint: disable=g-import-not-at-top
  return gguf.GGUFReader(path)
