"""Paths as users write them, made usable everywhere at the edge of the program.

Users and the README write relative paths (`--job_log_dir=runs/a`); orbax refuses relative
checkpoint paths, and a relative path recorded in a config would mean something else when
the config is replayed from another folder. So the executor resolves every local path it is
given once, against the working directory, and leaves remote URLs (`gs://...`) as they are.
"""

from __future__ import annotations

import os

from etils import epath


def is_remote(text: str) -> bool:
  """`gs://bucket/x`, `s3://...`: anything with a scheme, which epath opens itself."""
  return "://" in text


def resolve(text: str | os.PathLike) -> epath.Path:
  """An absolute local path (`~` expanded, against the working directory) or the URL as is."""
  text = os.fspath(text)
  if is_remote(text):
    return epath.Path(text)
  return epath.Path(os.path.abspath(os.path.expanduser(text)))
