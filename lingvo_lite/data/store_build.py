"""Builds a token store from a seqio Task with an Apache Beam pipeline.

As seqio's own `cache_tasks_main` does, the pipeline is sharded over the Task's input files:
each element is one group of files (seqio's `ShardInfo(g, G)` of the Task's source), read
through the Task's source and preprocessors (tokenize, append EOS: one example per document)
and written as one store shard, whose ledger entry marks it finished. The main process then
checks the ledger, writes the manifest and publishes the store (`token_store.publish`).

On this machine and in CI the pipeline runs on Beam's DirectRunner: in this process for a
small input, else with one worker process per core; the same pipeline runs on Dataflow, Flink
or Spark by passing their pipeline options (`pipeline_args`, see the README's "Data: token
stores"). The pipeline's own log lines go to `.<store>.build.log` beside the store. A worker
that fails (bad data, or whatever the task's code raises) writes the one-line message into the
partial store's `errors/` folder before failing, so the message reaches the user whatever the
runner does with the exception. A failed build removes what it made: the partial store, its
lock file, the log (kept, and named in the message, only when the runner failed without a
worker's message) and the folders it created, once empty.

Longer than 300 lines with a reason: it is one pipeline, read top to bottom: grouping the task's
files into shards, the worker that writes a shard, its run with progress and log, and the cleanup
of a failed build, which all share the partial store's folders and its `errors/` messages (Beam's
options are data/beam_options.py's).

A store of preference pairs (a task with `document_pairs`: each pair two consecutive
documents, chosen then rejected) counts the pairs whose two sides are the same tokens and
weights (`equal_pair`): DPO's gradient on such a pair is zero. The count is in the manifest
(`equal_pairs`; data/preference_data.py warns of it); a split of nothing else is refused.
"""

from __future__ import annotations

import functools
import os
import re
import time
import uuid
from typing import Any, Sequence

import numpy as np
from etils import epath

from lingvo_lite import paths
from lingvo_lite.runtime import user_code
from lingvo_lite.data import (beam_options, build_output, store_folders, task_facts, token_store,
                              vocabulary)
from lingvo_lite.runtime.tensorflow_import import import_tensorflow
from lingvo_lite.errors import DataError, UsageError, data_error_from, error_cause, one_line

# A group of input files is one pipeline element and one store shard. Each costs ~0.1 s to set
# up (a tf.data pipeline over the Task's source and preprocessors), so groups are large: about
# GROUP_BYTES of input each. The groups, and so the order of the token stream, depend on the
# input alone (the store's key records GROUP_BYTES as its layout), never on the workers.
GROUP_BYTES = 32 << 20
MAX_SHARDS = 4096
# Below this much input, one worker in this process is fastest: a worker process spends ~5 s
# importing TensorFlow before its first document, while this process tokenizes ~2M tokens/s
# (measured on 2 cores, the stdlib's 11 MB train split in 3 shards: 3.4 s in this process,
# 8.3 s on 2 worker processes; 500 MB of text on 2 workers ran at 0.76x one process's encode).
IN_PROCESS_BYTES = 64 << 20


def describe_preprocessor(function: Any) -> str:
  """A preprocessor as a store's key records it: its stable name, with a partial's bound
  arguments, without the memory addresses of default reprs (which differ every run)."""
  return _stable(_describe(function))


def _describe(function: Any) -> str:
  if isinstance(function, functools.partial):
    bound = [repr(a) for a in function.args] + [f"{k}={v!r}" for k, v in
                                                 sorted(function.keywords.items())]
    return f"{_describe(function.func)}({', '.join(bound)})"
  name = getattr(function, "__qualname__", type(function).__qualname__)
  return f"{getattr(function, '__module__', '?')}.{name}"


def _stable(text: str) -> str:
  return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def _targets_vocabulary(task: Any):
  try:
    return task.output_features["targets"].vocabulary
  except (AttributeError, KeyError, TypeError):
    raise UsageError(f"task={getattr(task, 'name', task)!r}: has no 'targets' feature with a "
                     "vocabulary; a token store holds a language-model task's targets") from None


def input_files(task: Any, split: str) -> list[str]:
  """The Task source's input shards of `split` (file paths for file sources), from the task's
  facts where it gives them.

  Raises:
    UsageError: the source (the task's own code) failed to list them.
  """
  facts = task_facts.facts_of(task)
  list_shards = facts.input_files if facts is not None else task.source.list_shards
  return user_code.call_user_code(
      lambda: list(list_shards(split)),
      f"task={task.name!r}: listing the input files of split {split!r}")


def store_key(task: Any, split: str, shard_bytes: int | None = None) -> dict[str, Any]:
  """What a store built from `task`'s `split` now would be keyed by (see `KEY_FIELDS`); from
  the task's facts where it gives them (no TensorFlow), else from the made Task."""
  shard_bytes = shard_bytes or GROUP_BYTES
  facts = task_facts.facts_of(task)
  if facts is not None:
    vocab, preprocessors = facts.vocabulary, list(facts.preprocessors)
  else:
    made = _targets_vocabulary(task)
    vocab = vocabulary.VocabularyFacts(vocabulary.fingerprint(made), int(made.vocab_size))
    preprocessors = [describe_preprocessor(p) for p in task.preprocessors]
  sources = []
  for name in input_files(task, split):
    entry: dict[str, Any] = {"path": name}
    if not paths.is_remote(name) and os.path.isfile(name):
      stat = os.stat(name)
      entry.update(size=stat.st_size, mtime_ns=stat.st_mtime_ns)
    sources.append(entry)
  return {
      "schema": token_store.SCHEMA,
      "task": task.name,
      "split": split,
      "vocabulary": {"fingerprint": vocab.fingerprint, "size": vocab.vocab_size},
      "preprocessors": preprocessors,
      "sources": sources,
      # How input files map to shards fixes the order of the token stream, so it is part of
      # what a store holds: it depends on the input alone, never on the workers of a build.
      "layout": {"shard_bytes": shard_bytes, "files": "strided"},
  }


def equal_pair(chosen: tuple[np.ndarray, np.ndarray | None],
               rejected: tuple[np.ndarray, np.ndarray | None]) -> bool:
  """Whether a preference pair's two sides, each (token ids, loss weights or None), are the
  same tokens with the same weights: two answers that differ in text but template and
  tokenize alike are equal too. DPO learns nothing from such a pair (its loss is log 2 and
  its gradient zero, whatever the model)."""
  return bool(np.array_equal(chosen[0], rejected[0]) and (
      (chosen[1] is None and rejected[1] is None)
      or (chosen[1] is not None and rejected[1] is not None
          and np.array_equal(chosen[1], rejected[1]))))


def _group_documents(task: Any, split: str, group: int, num_groups: int, vocab_size: int,
                     files: Sequence[str], counts: dict[str, Any]
                     ) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
  """Every document of one group of input files, tokenized, in the source's order.

  An example whose `skipped` field holds a reason (a format's bad record, with
  `--skip_bad_records`) is no document: it is counted into `counts["skipped"]` ({"count",
  "first"}); an empty document is left out and counted into `counts["empty_documents"]`."""
  import_tensorflow()
  import seqio  # pylint: disable=g-import-not-at-top
  dataset = task.source.get_dataset(split=split, shuffle=False,
                                    shard_info=seqio.ShardInfo(group, num_groups))
  dataset = task.preprocess_precache(dataset)
  dataset = task.preprocess_postcache(dataset, sequence_length=None)
  documents, weights = [], []
  for number, example in enumerate(dataset.as_numpy_iterator()):
    reason = example.get("skipped", b"")
    if reason:
      skipped = counts.setdefault("skipped", {})
      skipped["count"] = skipped.get("count", 0) + 1
      skipped.setdefault("first", reason.decode("utf-8", "replace"))
      continue
    targets = np.asarray(example["targets"])
    if targets.ndim != 1:
      raise DataError(f"{_files_shown(files)}: document {number}: 'targets' has shape "
                      f"{targets.shape}; a token store holds one 1-D token list per document")
    if not targets.size:
      counts["empty_documents"] = counts.get("empty_documents", 0) + 1
      continue
    if targets.min() < 0 or targets.max() >= vocab_size:
      raise DataError(f"{_files_shown(files)}: document {number}: token id "
                      f"{int(targets.max() if targets.max() >= vocab_size else targets.min())} "
                      f"outside the vocabulary [0, {vocab_size})")
    documents.append(targets)
    if "weights" in example:
      weight = np.asarray(example["weights"], dtype=np.float32)
      if weight.shape != targets.shape:
        raise DataError(f"{_files_shown(files)}: document {number}: {weight.size} loss weights "
                        f"for {targets.size} tokens")
      weights.append(weight)
  if weights and len(weights) != len(documents):
    raise DataError(f"{_files_shown(files)}: some documents have 'weights' and some do not")
  return documents, (weights or None)


def _equal_pairs(documents: list[np.ndarray], weights: list[np.ndarray] | None) -> int:
  """How many of the pairs (documents 2p, 2p + 1) are `equal_pair`s."""
  side = lambda i: (documents[i], weights[i] if weights is not None else None)
  return sum(equal_pair(side(i), side(i + 1)) for i in range(0, len(documents) - 1, 2))


def _files_shown(files: Sequence[str]) -> str:
  return files[0] if len(files) == 1 else f"{files[0]} (or one of {len(files) - 1} more files)"


def _data_error_message(error: BaseException, files: Sequence[str]) -> str:
  # A DataError, or a file-reading task's bad-record message inside TensorFlow's wrapping.
  found = data_error_from(error)
  if found is not None and str(found).strip():
    return one_line(str(found).strip())
  return one_line(f"{_files_shown(files)}: {error_cause(error)}")


def build_group(task: Any, split: str, partial: str, group: int, num_groups: int,
                vocab_size: int, dtype: str, files: Sequence[str],
                main_pid: int) -> dict[str, Any]:
  """One pipeline element: reads, tokenizes and writes one group's shard (in a worker)."""
  store = epath.Path(partial)
  if os.getpid() != main_pid:
    # A worker process of its own: its TensorFlow needs no GPU (probing for one prints
    # "failed call to cuInit" on a CPU machine), and SentencePiece's loads need no log lines.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import sentencepiece  # pylint: disable=g-import-not-at-top
    sentencepiece.set_min_log_level(2)
  try:
    counts: dict[str, Any] = {"files": len(files)}
    documents, weights = _group_documents(task, split, group, num_groups, vocab_size, files,
                                          counts)
    if getattr(task, "document_pairs", False):
      counts["equal_pairs"] = _equal_pairs(documents, weights)
    return token_store.write_shard(store, group, documents, weights, np.dtype(dtype), counts)
  # The task's code runs here: a sys.exit() in it must fail the build, not end the process
  # (the in-process runner's) as if all went well.
  except user_code.USER_CODE_FAILURES as e:  # pylint: disable=broad-except
    message = _data_error_message(e, files)
    errors = store / "errors"
    errors.mkdir(parents=True, exist_ok=True)
    (errors / f"{token_store.shard_name(group)}.txt").write_text(message, encoding="utf-8")
    raise DataError(message) from None


def _run_pipeline(task: Any, split: str, partial: epath.Path, groups: list[list[str]],
                  vocab_size: int, dtype: str, workers: int,
                  pipeline_args: Sequence[str]) -> None:
  import logging  # pylint: disable=g-import-not-at-top
  beam = beam_options.import_beam()
  # Worker processes import this project and TensorFlow: find the one and quiet the other.
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  os.environ["PYTHONPATH"] = os.pathsep.join(
      [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  num_groups, main_pid = len(groups), os.getpid()
  root_logger = logging.getLogger()
  level = root_logger.level
  # Beam logs a failed element's traceback, and warns about optional cloud clients; the
  # failure reaches the user as one line from the errors/ folder instead.
  root_logger.setLevel(logging.CRITICAL)
  try:
    with beam.Pipeline(options=beam_options.pipeline_options(workers, pipeline_args)) as pipeline:
      _ = (pipeline
           | "groups" >> beam.Create(list(range(num_groups)))
           | "spread" >> beam.Reshuffle()
           | "build" >> beam.Map(lambda g: build_group(task, split, str(partial), g,
                                                       num_groups, vocab_size, dtype,
                                                       groups[g], main_pid)))
  finally:
    root_logger.setLevel(level)


def build_store(task: Any, split: str, path: epath.Path, *, workers: int | None = None,
                pipeline_args: Sequence[str] = (), progress: bool = True,
                key: dict[str, Any] | None = None) -> dict[str, Any]:
  """Builds `task`'s `split` into a store at `path` and publishes it; returns its manifest.

  A failed build leaves nothing behind: no partial store, lock file or log, nor the folders
  it made for them (a log the message names is kept when the runner failed without a
  worker's message).

  Raises:
    UsageError: the split has no input files, or `path` is a folder of something else or
      inside another store.
    DataError: bad data met in a worker, or anything else it raised (its one line), or the
      pipeline failed.
  """
  key = key or store_key(task, split)
  files = [source["path"] for source in key["sources"]]  # The key listed them: no second walk.
  if not files:
    raise UsageError(f"task={task.name!r}: split {split!r} has no input files")
  store_folders.refuse_foreign_folder(path)
  made = store_folders.make_folders(path)
  try:
    with store_folders.build_lock(path) as lock_file:
      try:
        existing = token_store.read_manifest(path)
        if existing is not None and token_store.manifest_difference(key, existing) is None:
          return existing  # Another process built it while this one waited.
        if not paths.is_remote(os.fspath(path)):  # Under the lock, any partial is a dead build's.
          for dead in path.parent.glob(f".{path.name}.partial-*"):
            dead.rmtree()
        return _build(task, split, path, files, key, workers, pipeline_args, progress)
      except BaseException:
        if lock_file is not None:  # Removed while held: see store_folders.build_lock.
          store_folders.remove_file(lock_file)
        raise
  except BaseException:
    for folder in reversed(made):  # A failed build into a new folder leaves no folder behind.
      try:
        folder.rmdir()  # Only once empty: a store of another split built in it stays.
      except (OSError, ValueError):  # etils raises ValueError for a folder not empty.
        break
    raise


def _build(task: Any, split: str, path: epath.Path, files: list[str], key: dict[str, Any],
           workers: int | None, pipeline_args: Sequence[str], progress: bool) -> dict[str, Any]:
  input_bytes = sum(s.get("size", 0) for s in key["sources"])
  if workers is None:
    workers = 1 if input_bytes < IN_PROCESS_BYTES else (os.cpu_count() or 1)
  shard_bytes = key["layout"]["shard_bytes"]
  num_groups = max(1, min(len(files), MAX_SHARDS, -(-input_bytes // shard_bytes)))
  groups = [files[g::num_groups] for g in range(num_groups)]  # seqio's ShardInfo(g, G).
  workers = max(1, min(workers, num_groups))
  vocab_size = key["vocabulary"]["size"]
  dtype = token_store.token_dtype(vocab_size).name
  partial = path.parent / f".{path.name}.partial-{uuid.uuid4().hex[:8]}"
  log = build_output.build_log(path)
  keep_log = False
  started = time.perf_counter()
  try:
    try:
      partial.mkdir()
      open(log, "w").close()  # pylint: disable=consider-using-with
    except OSError as e:
      raise DataError(f"building the token store of {task.name}/{split}: cannot write beside "
                      f"{path} ({e.strerror or e})") from None
    with build_output.worker_logs_to(log) as stream, build_output.ShardProgress(
        partial, num_groups, f"building {task.name}/{split}", progress, stream):
      try:
        _run_pipeline(task, split, partial, groups, vocab_size, dtype, workers, pipeline_args)
      # KeyboardInterrupt and SystemExit too: the in-process runner runs the task's code here.
      except user_code.USER_CODE_FAILURES as e:  # pylint: disable=broad-except
        message = _worker_message(partial)
        if message:
          raise DataError(message) from None
        if isinstance(e, KeyboardInterrupt):
          raise  # Ctrl-C, met by the runner, not a worker's: nothing of the build is kept.
        keep_log = True  # What the runner said of it is all there is to go on.
        raise DataError(one_line(f"building the token store of {task.name}/{split} failed: "
                                   f"{error_cause(e)}; the pipeline's log is {log}")) from None
    manifest = _manifest(task, split, key, partial, num_groups, dtype)
    manifest["build"] = {"seconds": round(time.perf_counter() - started, 2), "workers": workers,
                         "pipeline_args": list(pipeline_args),
                         "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    token_store.publish(partial, path, manifest)
  except BaseException:
    if not keep_log:
      # The one-line message says it all; the log holds only start-up lines.
      store_folders.remove_file(log)
    raise
  finally:
    store_folders.remove_partial(partial)
  return manifest


def _manifest(task: Any, split: str, key: dict[str, Any], partial: epath.Path,
              num_groups: int, dtype: str) -> dict[str, Any]:
  """The finished shards' ledger summed into the store's manifest (its `build` apart).

  Raises:
    DataError: a shard never finished.
    UsageError: the split holds nothing to train on (`_refuse_nothing_to_learn`).
  """
  ledger = token_store.read_ledger(partial)
  missing = sorted(set(range(num_groups)) - set(ledger))
  if missing:
    raise DataError(f"building the token store of {task.name}/{split}: shards {missing[:5]} "
                    "never finished")
  shards = [ledger[g] for g in range(num_groups)]
  tokens = sum(s["tokens"] for s in shards)
  skips = [s["skipped"] for s in shards if s.get("skipped")]
  skipped = ({"count": sum(s["count"] for s in skips), "first": skips[0]["first"]} if skips
             else None)
  documents = sum(s["documents"] for s in shards)
  equal_pairs = (sum(s.get("equal_pairs", 0) for s in shards)
                 if getattr(task, "document_pairs", False) else None)
  _refuse_nothing_to_learn(f"task={task.name!r}: split {split!r}", tokens, documents, skipped,
                           sum(s.get("empty_documents", 0) for s in shards), equal_pairs)
  has_weights = any((partial / "shards" / token_store.shard_name(g) / "weights").exists()
                    for g in range(num_groups))
  return {**key, "dtype": dtype, "tokens": tokens,
          **({"skipped_records": skipped} if skipped else {}),
          **({"equal_pairs": equal_pairs} if equal_pairs is not None else {}),
          "documents": documents, "has_weights": has_weights,
          "block_tokens": token_store.BLOCK_TOKENS,
          "shards": [{"tokens": s["tokens"], "documents": s["documents"], "files": s["files"]}
                     for s in shards]}


def _refuse_nothing_to_learn(where: str, tokens: int, documents: int,
                             skipped: dict[str, Any] | None, empty: int,
                             equal_pairs: int | None) -> None:
  """Refuses a split with nothing to train on, naming why: every record bad and skipped,
  every document empty, or (preference pairs) every pair's sides equal.

  Raises:
    UsageError: one line; the skipped records' count and the first one's reason.
  """
  bad = (f"{skipped['count']:,} bad record{'s' * (skipped['count'] != 1)} skipped "
         f"(--skip_bad_records; the first: {skipped['first']})") if skipped else ""
  if not tokens and skipped and not empty:
    raise UsageError(f"{where}: every record is bad: {bad}; fix the records, or give files "
                     "with some good ones")
  if not tokens:
    raise UsageError(f"{where} holds no tokens: " + (
        f"{bad}, and the other {empty:,} documents are empty" if skipped
        else "every document is empty"))
  pairs = documents // 2
  if equal_pairs is not None and pairs and equal_pairs == pairs:
    raise UsageError(
        f"{where}: every one of its {pairs:,} preference pairs has 'chosen' equal to "
        "'rejected' once templated and tokenized, so DPO learns nothing from them; give pairs "
        "whose answers differ")


def _worker_message(partial: epath.Path) -> str:
  """The one line a failed worker wrote into the partial store's errors/ folder, or ''."""
  try:
    errors = sorted((partial / "errors").glob("*.txt")) if (partial / "errors").exists() else []
    for file in errors:
      text = file.read_bytes().decode("utf-8", "backslashreplace").strip()
      if text:
        return text
  except OSError:
    pass
  return ""
