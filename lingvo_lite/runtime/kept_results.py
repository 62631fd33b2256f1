"""Small results kept under the run's compilation cache folder, one JSON file per digest.

Some things a run finds out cost seconds and depend only on the machine and the program: XLA's
analyses of a compile (programs/compile/analyses.py), this host's float32 matmul peak
(mfu.py). They are kept beside JAX's compiled programs, in `<cache folder>/<kind>/<digest>.json`,
where the digest covers everything the result depends on, so a different machine, program or
compiler finds nothing and measures again. Files are written whole (a temporary renamed into
place); one that cannot be read back as written counts as absent. A folder that cannot be
written, or a remote one, costs only the next run's time.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from etils import epath

from lingvo_lite import input_files, paths

SCHEMA = 1


def digest(described: dict[str, Any]) -> str:
  """The key of what `described` (JSON-ready) names."""
  return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def _path(cache_folder: str | None, kind: str, key: str) -> str | None:
  # A remote cache folder (gs://...) keeps JAX's programs only: these few seconds are not
  # worth a round trip, and os.makedirs would make a local folder named "gs:".
  if not cache_folder or paths.is_remote(cache_folder):
    return None
  return os.path.join(cache_folder, kind, f"{key}.json")


def read(cache_folder: str | None, kind: str, key: str) -> dict[str, Any] | None:
  """The result kept under `key`, or None (no folder, none kept, or not readable whole)."""
  path = _path(cache_folder, kind, key)
  if path is None:
    return None
  try:
    with open(path, encoding="utf-8") as f:
      kept = input_files.json_value(f.read())
  except (OSError, ValueError):
    return None
  return kept if isinstance(kept, dict) and kept.get("schema") == SCHEMA else None


def write(cache_folder: str | None, kind: str, key: str, result: dict[str, Any]) -> None:
  """Keeps `result` (JSON-ready) under `key`; nothing where there is no folder or it cannot
  be written."""
  path = _path(cache_folder, kind, key)
  if path is None:
    return
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    paths.write_atomically(epath.Path(path), json.dumps({"schema": SCHEMA, **result}) + "\n")
  except OSError:
    pass
