"""Packed LM examples from windows of a token stream: a pure function of the example index.

Example i of a store is the window [i * L, (i + 1) * L) of the split's token stream (its
documents end to end, each ending in EOS). Every token is a target exactly once per epoch:
nothing is padded away or truncated; a document longer than L, or one that crosses a window
edge, is split into chunks at the window edges, and the last window is padded (weight 0).
Within a window each document (chunk) is its own segment: attention stays inside it
(`segment_ids`), positions restart at 0 (`positions`), and its inputs are its targets shifted
right with a 0 at its first token, as seqio's packed LM features are. A segment is therefore
computed exactly as that document chunk run alone. The packing needs no index: O(1) memory.
"""

from __future__ import annotations

import numpy as np

from lingvo_lite.data.source import Batch


def packed_batch(tokens: np.ndarray, weights: np.ndarray, document_start: np.ndarray,
                 lengths: np.ndarray) -> Batch:
  """The model's batch from `TokenStore.read`'s windows.

  Args:
    tokens: int32 [R, L].
    weights: float32 [R, L]: the stored loss weights (0 on a prompt's tokens).
    document_start: bool [R, L], True where a document (or chunk) starts.
    lengths: int [R]: real tokens per row; the rest (only in the stream's last window) pads.

  Returns:
    inputs, targets, weights, segment_ids (1, 2, ... per window; 0 on padding) and positions.
  """
  index = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
  padding = index >= np.asarray(lengths)[:, None]
  segment_ids = np.where(padding, 0, np.cumsum(document_start, axis=1, dtype=np.int32))
  segment_begin = np.maximum.accumulate(np.where(document_start, index, 0), axis=1)
  positions = np.where(padding, 0, index - segment_begin).astype(np.int32)
  inputs = np.zeros_like(tokens)
  inputs[:, 1:] = tokens[:, :-1]
  inputs = np.where(document_start | padding, 0, inputs)
  return {"inputs": inputs, "targets": np.where(padding, 0, tokens),
          "weights": np.where(padding, 0.0, weights).astype(np.float32),
          "segment_ids": segment_ids, "positions": positions}
