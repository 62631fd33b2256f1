"""Imports TensorFlow (the engine of seqio and clu's summary writer) without its start-up noise.

TensorFlow's C++ runtime prints several lines to stderr while loading (oneDNN, missing CUDA
drivers) before its log level applies. They look like errors to a user of a CPU machine, so
stderr is pointed at /dev/null for the duration of the import only. Import errors still
surface as Python exceptions.
"""

from __future__ import annotations

import os
import sys
import types

from lingvo_lite.errors import UsageError


def import_tensorflow() -> types.ModuleType:
  if "tensorflow" in sys.modules:
    return sys.modules["tensorflow"]
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with open(os.devnull, "w") as devnull:
      os.dup2(devnull.fileno(), 2)
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
  finally:
    os.dup2(saved, 2)
    os.close(saved)
  # The data pipeline runs on the CPU; leave every accelerator to JAX.
  tf.config.set_visible_devices([], "GPU")
  return tf


def import_seqio() -> tuple[types.ModuleType, types.ModuleType]:
  """(tensorflow, seqio), TensorFlow imported quietly first.

  Raises:
    UsageError: this Python lacks them (a machine with only the JAX stack can still train on
      synthetic data).
  """
  try:
    tf = import_tensorflow()
    import seqio  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise UsageError(f"needs seqio and TensorFlow, which this Python lacks ({e}); install "
                     "them, or train on --fiddler=synthetic_data") from None
  return tf, seqio
