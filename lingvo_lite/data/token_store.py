"""The token store: one split of a tokenized corpus as tensorstore arrays, read by random access.

Layout of a store folder (a local path or a `gs://` URL; tensorstore reads both alike):

  manifest.json            written last: what the store was built from and what it holds
  shards/00042/tokens      zarr, 1-D: the documents of one group of input files, end to end
  shards/00042/doc_starts  zarr int64: where each document starts in `tokens`
  shards/00042/block_docs  zarr int64: the document holding token k * BLOCK_TOKENS (an index
                           that keeps a window's lookup to one small read of doc_starts)
  shards/00042/weights     zarr float32, only for tasks with loss weights (prompt/completion)
  ledger/00042.json        a finished shard's counts, written by the worker that built it

The split's token stream is the shards' tokens in shard order. A reader maps a global token
range to (shard, offset) with the shards' cumulative token counts from the manifest, so
reading any example touches only that example's window: the loader's memory does not grow
with the corpus (tensorstore's cache pool is capped at `CACHE_BYTES`).

A store is published whole: a build writes into a `.partial-*` folder beside the final one,
writes `manifest.json` last, then renames the folder into place. A folder without a manifest
is never read; a manifest that no longer matches its task (files, vocabulary, preprocessors)
is reported by `manifest_difference`, and the store is rebuilt or refused, never reused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from typing import Any, Sequence

import numpy as np
from etils import epath

from lingvo_lite import input_files, paths
from lingvo_lite.errors import DataError

SCHEMA = "lingvo_lite.token_store/1"
BLOCK_TOKENS = 4096
CHUNK_ELEMENTS = 1 << 15  # 64 KiB of uint16 tokens per zarr chunk: one disk read per window.
CACHE_BYTES = 8 << 20  # Random windows rarely share a chunk; the OS page cache keeps hot files.
# What identifies the data a store holds; the rest of the manifest describes the build.
KEY_FIELDS = ("schema", "task", "split", "vocabulary", "preprocessors", "layout", "sources")


def token_dtype(vocab_size: int) -> np.dtype:
  """The smallest unsigned dtype that holds every id of the vocabulary."""
  return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _url(path: epath.Path | str) -> str:
  text = os.fspath(path)
  return text if paths.is_remote(text) else "file://" + os.path.abspath(text)


def _context():
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  return ts.Context({"cache_pool": {"total_bytes_limit": CACHE_BYTES},
                     "data_copy_concurrency": {"limit": 4}})


def _open(path: epath.Path, context, metadata: dict[str, Any] | None = None, **kwargs):
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  spec = {"driver": "zarr", "kvstore": _url(path), "recheck_cached_data": False}
  if metadata:
    spec["metadata"] = metadata
  return ts.open(spec, context=context, **kwargs).result()


def shard_name(index: int) -> str:
  return f"{index:05d}"


def write_shard(store: epath.Path, index: int, documents: Sequence[np.ndarray],
                weights: Sequence[np.ndarray] | None, dtype: np.dtype,
                ledger: dict[str, Any]) -> dict[str, Any]:
  """Writes one shard's arrays, then its ledger entry (the mark that it is finished).

  Args:
    store: The (partial) store folder.
    index: The shard's number.
    documents: Token ids of each document, in order; none empty.
    weights: Loss weights per token of each document, or None (all 1).
    dtype: The store's token dtype.
    ledger: Facts to record with the shard (its input files).

  Returns:
    The ledger entry: counts and `ledger`'s facts.
  """
  tokens = np.concatenate(documents).astype(dtype) if documents else np.zeros(0, dtype)
  lengths = np.array([len(d) for d in documents], dtype=np.int64)
  doc_starts = np.cumsum(lengths) - lengths
  entry = {"shard": index, "tokens": int(tokens.size), "documents": len(documents), **ledger}
  folder = store / "shards" / shard_name(index)
  if tokens.size:
    context = _context()
    block_starts = np.minimum(np.arange(0, tokens.size + BLOCK_TOKENS, BLOCK_TOKENS),
                              tokens.size - 1)
    block_docs = np.searchsorted(doc_starts, block_starts, side="right") - 1
    arrays = {"tokens": tokens, "doc_starts": doc_starts, "block_docs": block_docs}
    if weights is not None:
      arrays["weights"] = np.concatenate(weights).astype(np.float32)
    for name, values in arrays.items():
      array = _open(folder / name, context, create=True, delete_existing=True,
                    metadata={"shape": [values.size], "dtype": values.dtype.str,
                              "chunks": [min(CHUNK_ELEMENTS, values.size)],
                              "compressor": None})
      array.write(values).result()
  ledger_file = store / "ledger" / f"{shard_name(index)}.json"
  ledger_file.parent.mkdir(parents=True, exist_ok=True)
  paths.write_atomically(ledger_file, json.dumps(entry))
  return entry


def read_ledger(store: epath.Path) -> dict[int, dict[str, Any]]:
  """The finished shards of a (partial) store, by shard number."""
  folder = store / "ledger"
  if not folder.exists():
    return {}
  entries = {}
  for file in folder.glob("*.json"):
    entry = input_files.json_value(file.read_text())
    entries[int(entry["shard"])] = entry
  return entries


def read_manifest(store: epath.Path) -> dict[str, Any] | None:
  """The store's manifest, or None when there is no complete store at `store`."""
  file = store / "manifest.json"
  if not file.exists():
    return None
  try:
    manifest = input_files.json_value(input_files.read_bytes(file, str(file), "delete the folder to "
                                                 "rebuild the store"))
  except (OSError, ValueError, RecursionError) as e:
    raise DataError(f"{file}: unreadable token-store manifest ({e}); delete the folder to "
                    "rebuild it") from None
  return manifest if isinstance(manifest, dict) else None


def manifest_difference(expected: dict[str, Any], manifest: dict[str, Any]) -> str | None:
  """The first way a store's manifest differs from what its task would build now, in words
  (None when it matches): the schema, the task, the vocabulary, the preprocessors, or a
  source file added, removed or changed."""
  for field in KEY_FIELDS:
    if expected.get(field) == manifest.get(field):
      continue
    if field != "sources":
      return f"its {field} is {manifest.get(field)!r}, the task's is {expected.get(field)!r}"
    built = {s["path"]: s for s in manifest.get("sources") or []}
    now = {s["path"]: s for s in expected.get("sources") or []}
    for path in sorted(set(built) | set(now)):
      if path not in now:
        return f"source file {path} is gone"
      if path not in built:
        return f"source file {path} is new"
      if built[path] != now[path]:
        return f"source file {path} changed (size or modification time)"
    return "its list of source files differs"
  return None


def publish(partial: epath.Path, final: epath.Path, manifest: dict[str, Any]) -> None:
  """Writes the manifest into the finished partial store and moves it to `final`.

  A store already at `final` with the same key (a concurrent build won the race) is kept and
  the partial one dropped; a stale one is moved aside first and removed after.
  """
  paths.write_atomically(partial / "manifest.json", json.dumps(manifest, indent=1))
  existing = read_manifest(final) if final.exists() else None
  if existing is not None and manifest_difference(manifest, existing) is None:
    partial.rmtree()
    return
  if existing is None and final.exists() and (not final.is_dir() or any(final.iterdir())):
    partial.rmtree()  # Checked before the build too: only a store is ever replaced.
    raise DataError(f"{final}: exists and is not a token store; the new store was not "
                    "published")
  stale = None
  if final.exists():
    stale = final.parent / f".{final.name}.stale-{uuid.uuid4().hex[:8]}"
    final.rename(stale)
  partial.rename(final)
  if stale is not None:
    stale.rmtree()


@dataclasses.dataclass
class _Shard:
  folder: epath.Path
  tokens: int
  documents: int
  arrays: dict[str, Any] = dataclasses.field(default_factory=dict)
  block_docs: np.ndarray | None = None


class TokenStore:
  """Random-access reader of a published store: windows of the token stream, with where the
  documents in each window start."""

  def __init__(self, path: epath.Path, manifest: dict[str, Any]):
    self.path = path
    self.manifest = manifest
    self.has_weights = bool(manifest.get("has_weights"))
    self._shards = [_Shard(path / "shards" / shard_name(i), int(s["tokens"]),
                           int(s["documents"])) for i, s in enumerate(manifest["shards"])]
    self._ends = np.cumsum([s.tokens for s in self._shards], dtype=np.int64)
    self.num_tokens = int(self._ends[-1]) if len(self._ends) else 0
    self._context = _context()
    self._document_starts: np.ndarray | None = None

  def _arrays(self, index: int) -> _Shard:
    """Opens a shard's arrays on first use (a store of 10,000 shards opens only those read)."""
    shard = self._shards[index]
    if not shard.arrays:
      names = ("tokens", "doc_starts", "block_docs") + (("weights",) if self.has_weights else ())
      try:
        for name in names:
          shard.arrays[name] = _open(shard.folder / name, self._context, open=True)
        shard.block_docs = np.asarray(shard.arrays["block_docs"].read().result())
      except (ValueError, OSError) as e:
        shard.arrays.clear()
        raise DataError(f"{shard.folder}: unreadable token-store shard ({e}); delete the store "
                        f"at {self.path} to rebuild it") from None
    return shard

  def document_starts(self) -> np.ndarray:
    """Where each document starts in the token stream (int64 [documents]), read whole once:
    for per-document scores of an eval split, which visit every document."""
    if self._document_starts is None:
      parts = [np.zeros(0, np.int64)]
      for index, shard in enumerate(self._shards):
        if not shard.tokens:
          continue  # An empty shard has no arrays.
        try:
          local = self._arrays(index).arrays["doc_starts"].read().result()
        except (ValueError, OSError) as e:
          raise DataError(f"{shard.folder}: unreadable document starts ({e}); delete the "
                          f"store at {self.path} to rebuild it") from None
        parts.append(np.asarray(local, np.int64) + int(self._ends[index]) - shard.tokens)
      self._document_starts = np.concatenate(parts)
    return self._document_starts

  def read(self, starts: np.ndarray, length: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Windows [start, start + length) of the token stream, clipped at its end.

    Returns:
      tokens [R, length] (int32, 0 past the end), weights [R, length] (float32: the stored
      loss weights, 1 without them, 0 past the end), and document_start [R, length] (bool:
      a document, or the window, begins at this token), and lengths [R] (tokens read per row:
      `length` except in the stream's last window).
    """
    rows = len(starts)
    tokens = np.zeros((rows, length), np.int32)
    weights = np.zeros((rows, length), np.float32)
    document_start = np.zeros((rows, length), bool)
    lengths = np.zeros(rows, np.int64)
    pending = []  # Every read of the batch is in flight at once; then the results are placed.
    for row, start in enumerate(np.asarray(starts, dtype=np.int64)):
      position, stop = int(start), min(int(start) + length, self.num_tokens)
      lengths[row] = max(stop - position, 0)
      while position < stop:
        index = int(np.searchsorted(self._ends, position, side="right"))
        shard = self._arrays(index)
        base = int(self._ends[index]) - shard.tokens
        lo, hi = position - base, min(stop, int(self._ends[index])) - base
        first_doc = int(shard.block_docs[lo // BLOCK_TOKENS])
        last_doc = int(shard.block_docs[(hi - 1) // BLOCK_TOKENS + 1]) + 1
        reads = {"tokens": shard.arrays["tokens"][lo:hi].read(),
                 "doc_starts": shard.arrays["doc_starts"][first_doc:last_doc].read()}
        if self.has_weights:
          reads["weights"] = shard.arrays["weights"][lo:hi].read()
        pending.append((row, position - int(start), lo, hi, shard, reads))
        position = base + hi
    for row, at, lo, hi, shard, reads in pending:
      try:
        values = {name: np.asarray(future.result()) for name, future in reads.items()}
      except (ValueError, OSError) as e:
        raise DataError(f"{shard.folder}: unreadable tokens [{lo}, {hi}) ({e}); delete the "
                        f"store at {self.path} to rebuild it") from None
      width = hi - lo
      tokens[row, at:at + width] = values["tokens"]
      weights[row, at:at + width] = values["weights"] if self.has_weights else 1.0
      document_start[row, at] = True  # A shard ends with a whole document, as does a window.
      inside = values["doc_starts"]
      inside = inside[(inside > lo) & (inside < hi)] - lo + at
      document_start[row, inside] = True
    return tokens, weights, document_start, lengths


def open_store(path: epath.Path) -> TokenStore:
  """The published store at `path`.

  Raises:
    DataError: there is no complete store there.
  """
  manifest = read_manifest(path)
  if manifest is None or manifest.get("schema") != SCHEMA:
    raise DataError(f"{path}: no complete token store (no manifest.json of schema {SCHEMA})")
  return TokenStore(path, manifest)
