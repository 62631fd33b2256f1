"""MXFP4: the OCP microscaling 4-bit float format in which gpt-oss's released checkpoints store
their experts' matrices, read back to float32.

A Hugging Face folder stores such a tensor `W` as two uint8 tensors: `W_blocks` [..., rows,
groups, 16], each byte two FP4 (E2M1) values, the low nibble first, 32 values per group; and
`W_scales` [..., rows, groups], each group's power of two as a biased exponent (E8M0: 2^(s -
127)). The values are rows x (groups x 32) of the transposed matrix: transformers'
`convert_moe_packed_tensors` swaps the last two axes after decoding, giving the layout an
unquantized checkpoint stores (gpt-oss's [experts, in, out]). Decoded here with NumPy, exactly
(every FP4 value times a power of two is a float32).
"""

from __future__ import annotations

import numpy as np

BLOCKS, SCALES = "_blocks", "_scales"
# E2M1: sign, 2 exponent bits, 1 mantissa bit.
_FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """float32 [..., groups x 32, rows]: the tensor `blocks` and `scales` hold (module doc).

  Raises:
    ValueError: their shapes do not fit together, or they are not uint8.
  """
  if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
    raise ValueError(f"MXFP4 blocks and scales are uint8, not {blocks.dtype} and {scales.dtype}")
  if blocks.ndim < 3 or blocks.shape[:-1] != scales.shape:
    raise ValueError(f"blocks {list(blocks.shape)} do not fit scales {list(scales.shape)} "
                     "(blocks: the scales' shape and 16 bytes)")
  values = np.empty((*blocks.shape[:-1], blocks.shape[-1] * 2), np.float32)
  values[..., 0::2] = _FP4[blocks & 0x0F]
  values[..., 1::2] = _FP4[blocks >> 4]
  values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
  values = values.reshape(*blocks.shape[:-2], -1)  # [..., rows, groups x 32]
  return np.ascontiguousarray(np.swapaxes(values, -1, -2))
