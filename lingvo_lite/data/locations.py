"""Where token stores and trained vocabularies live unless a config names a path."""

from __future__ import annotations

import os

from etils import epath

from lingvo_lite import paths


def data_root() -> epath.Path:
  """`$LINGVO_LITE_DATA_DIR`, else `~/.cache/lingvo_lite/data`: shared by every checkout and
  run on the machine, as the venv is, so a store or vocabulary is built once."""
  return paths.resolve(os.environ.get("LINGVO_LITE_DATA_DIR") or "~/.cache/lingvo_lite/data",
                       "LINGVO_LITE_DATA_DIR")
