"""One pass over each eval set of a Setup: the metrics, their table, and the files they go to.

A set is scored by an objective (training/objectives/: the job's own where it reads the set's
rows, a language-modelling job's set of preference pairs by DPO's measures): its eval step's
sums are added up over the set's batches, on the devices, and divided once at the end, so
every token (or pair) weighs the same whatever batch it fell in. The objective says what the
metrics are (lm.py: loss, perplexity, accuracy, bits per token and byte; dpo.py: the loss, the
rewards and accuracies); every pass adds

  tokens          weighted tokens evaluated (the objective's count)
  seconds         wall time of the pass, which the train program keeps out of its step time
  tokens_per_s    tokens / seconds

A set with `num_batches=None` is its whole split: ceil(examples / batch) batches, the rows of
the last one past the split's end weighing 0, so no example counts twice. Such a pass visits
every document, so an objective that scores documents (`scores_documents`) also runs the
seqio score metric functions its task defines (`(targets, scores)`), as seqio's evaluator
would: `targets` each document's text (decoded, through the task's postprocessor), `scores`
its log-likelihood (the sum over its weighted tokens, in nats). Their results join the set's
metrics. Prediction metrics need generated text, which an eval pass does not make; they are
left out with a note, as score metrics are on a sampled pass.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, Iterable, Mapping

import jax
import numpy as np
from absl import logging
from etils import epath

from lingvo_lite.data.source import DataSource, local_rows
from lingvo_lite.runtime import progress, summaries
from lingvo_lite.training import objectives
from lingvo_lite.training.objectives.objective import Objective

# What every results table shows after the objectives' own metrics, with their headings.
_ALWAYS_SHOWN = (("tokens", "tokens"), ("seconds", "seconds"))


class SetResults(dict):
  """Each eval set's metrics by name (a dict), and the objective that scored each: what its
  results table and lines show.

  Attributes:
    scorers: The objective that scored each set, by name.
  """

  def __init__(self, metrics: Mapping[str, Mapping[str, float]],
               scorers: Mapping[str, Objective]):
    super().__init__(metrics)
    self.scorers = dict(scorers)

  def summary(self, name: str) -> str:
    """Set `name`'s metrics in one line."""
    return self.scorers[name].eval_summary(self[name])

  def final_summary(self, name: str) -> str:
    """Set `name`'s metrics on the line a finished run ends with."""
    return self.scorers[name].final_summary(self[name])


def largest_set(setup: Any) -> tuple[str, DataSource]:
  """(name, source) of the eval set with the most tokens per batch: the eval step that
  `--mode=compile --compile_program=eval` compiles, since it decides the memory."""
  return max(setup.eval_sets.items(),
             key=lambda item: item[1].global_batch_size * item[1].sequence_length)


def replace_set(setup: Any, name: str, source: DataSource) -> Any:
  """`setup` with eval set `name` replaced by `source`."""
  eval_data = source if not isinstance(setup.eval_data, Mapping) else {
      **setup.eval_data, name: source}
  return dataclasses.replace(setup, eval_data=eval_data)


def pass_length(source: DataSource) -> tuple[int, int | None]:
  """(batches in one pass, examples in the split when the pass is the whole split)."""
  if source.num_batches:
    return source.num_batches, None
  examples = source.examples_per_pass()
  return max(math.ceil(examples / source.global_batch_size), 1), examples


class _DocumentScores:
  """Each document's summed token nats over a whole-split pass, for score metrics."""

  def __init__(self, source: Any):
    self._source = source
    self._starts = source.document_starts()
    self._nats = np.zeros(len(self._starts), np.float64)

  def add(self, step: int, token_nats: np.ndarray) -> None:
    """`token_nats` [B, T] of every global row of batch `step` (0 past the split's end)."""
    source = self._source
    positions = (source.batch_examples(step)[:, None] * source.sequence_length
                 + np.arange(source.sequence_length))
    documents = np.searchsorted(self._starts, positions, side="right") - 1
    np.add.at(self._nats, documents.ravel(), token_nats.ravel().astype(np.float64))

  def metrics(self, functions: tuple[Any, ...], set_name: str) -> dict[str, float]:
    targets = list(_document_targets(self._source))  # A copy: the function may change it.
    scores = -self._nats
    found: dict[str, float] = {}
    for function in functions:
      name = getattr(function, "__name__", repr(function))
      try:
        values = function(targets, scores)
      except Exception as e:  # pylint: disable=broad-except
        # The user's code, mid-run: a warning, not the end of a training run.
        _note(set_name, f"its task's metric function {name} raised {type(e).__name__}: "
              f"{str(e)[:200]}; left out")
        continue
      for key, value in (values or {}).items():
        value = getattr(value, "value", value)  # seqio.metrics.Scalar holds its number.
        if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
          found[key] = float(value)
    return found


@functools.lru_cache(maxsize=8)
def _document_targets(source: Any) -> list[Any]:
  """The split's documents as text, decoded once per process: training evaluates the same
  set again and again, and the text does not change."""
  return source.document_targets()


_NOTED: set[str] = set()


def _note(set_name: str, message: str) -> None:
  """A line about eval set `set_name`, once per process (not at every evaluation)."""
  line = f"eval set {set_name}: {message}"
  if line not in _NOTED:
    _NOTED.add(line)
    logging.warning("%s", line)


def _document_scores(source: DataSource, set_name: str, whole_split: bool
                     ) -> tuple[_DocumentScores | None, tuple[Any, ...]]:
  """The per-document accumulator and the score metrics to run, when the pass can run them."""
  score_fns, predict_fns = getattr(source, "metric_fns", ((), ()))
  if predict_fns:
    _note(set_name, "its task's prediction metrics (" + ", ".join(
        getattr(f, "__name__", repr(f)) for f in predict_fns) + ") need generated text, "
          "which an eval pass does not make; left out")
  if not score_fns:
    return None, ()
  if not whole_split:
    _note(set_name, "its task's score metrics need every document whole: they run on a pass "
          "over the whole split (num_batches=None); left out")
    return None, ()
  return _DocumentScores(source), score_fns


def evaluate_set(jitted: Any, params: Any, source: DataSource,
                 set_name: str = "", frozen: Any = None,
                 scorer: Objective | None = None) -> dict[str, float]:
  """One pass of `source` with `jitted`'s eval step (a jitted.JittedSteps) of the objective
  that scores it (`scorer`, else `jitted.scorer(source)`); `frozen`: the frozen parameters
  its steps read (a LoRA base, an objective's reference), or None."""
  objective = scorer if scorer is not None else jitted.scorer(source)
  started = time.perf_counter()
  num_batches, examples = pass_length(source)
  scores, score_fns = (_document_scores(source, set_name, examples is not None)
                       if objective.scores_documents else (None, ()))
  token_bytes = getattr(source, "token_bytes", None) if objective.measures_bytes else None
  eval_step = jitted.eval_step(objective, per_token=scores is not None)
  # This process's block of the rows (a process per block, or several: JittedSteps.data_block).
  process, processes = jitted.data_block[0], jitted.data_block[1]
  rows = local_rows(source.global_batch_size, process, processes)
  totals: dict[str, float] = {}
  text_bytes = 0.0
  with progress.Progress(f"eval {set_name}" if set_name else "eval", total=num_batches,
                         unit="batches") as bar:
    for step in range(num_batches):
      local = source.batch(step, process, processes)
      if examples is not None and (step + 1) * source.global_batch_size > examples:
        past_end = step * source.global_batch_size + rows >= examples  # Weighing nothing.
        local = {**local, "weights": np.where(past_end[:, None], 0.0, local["weights"]).astype(
            np.float32)}
      if token_bytes is not None:
        text_bytes += float(np.sum(token_bytes[local["targets"]] * (local["weights"] > 0)))
      sums = dict(eval_step(params, jitted.global_batch(local), frozen))
      if scores is not None:
        token_nats = sums.pop("token_nats")
        if processes > 1:  # Every process scores every row: the documents need them all.
          from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
          token_nats = multihost_utils.process_allgather(token_nats, tiled=True)
        scores.add(step, np.asarray(token_nats))
      for key, value in jax.device_get(sums).items():
        totals[key] = totals.get(key, 0.0) + float(value)
      bar.update()
  if token_bytes is not None and processes > 1:
    # Processes that read one block (a pipeline's stages across them) count its bytes once.
    text_bytes = _sum_over_processes(int(text_bytes)) * processes / jax.process_count()
  metrics = objective.eval_metrics(totals, text_bytes if token_bytes is not None else None)
  if scores is not None:
    for key, value in scores.metrics(score_fns, set_name).items():
      metrics[key if key not in metrics else f"task_{key}"] = value
  seconds = time.perf_counter() - started
  metrics["seconds"] = seconds
  metrics["tokens_per_s"] = metrics["tokens"] / max(seconds, 1e-9)  # eval_metrics' count.
  return metrics


def _sum_over_processes(count: int) -> float:
  """Each process's own rows' count, summed exactly: JAX gathers 32-bit values (x64 off), so
  the count travels as two 30-bit halves."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  halves = multihost_utils.process_allgather(np.asarray(divmod(count, 1 << 30), np.int32))
  return float(sum(int(high) * (1 << 30) + int(low) for high, low in np.reshape(halves, (-1, 2))))


def evaluate_sets(jitted: Any, params: Any, sets: Mapping[str, DataSource],
                  frozen: Any = None) -> SetResults:
  """Each set's metrics, by name, in the sets' order (`frozen`: as for `evaluate_set`), with
  the objective that scored each."""
  scorers = {name: jitted.scorer(source) for name, source in sets.items()}
  return SetResults({name: evaluate_set(jitted, params, source, name, frozen, scorers[name])
                     for name, source in sets.items()}, scorers)


def table(results: Mapping[str, Mapping[str, float]]) -> str:
  """The results as an aligned table, one row per set (missing metrics shown as '-'): the
  metrics of the objectives that scored them (`SetResults`; of every objective's metrics the
  sets have, for a plain mapping), then tokens and seconds."""
  scorers = getattr(results, "scorers", None)
  if scorers is None:
    scorers = {kind.__name__: kind() for kind in objectives.SCORERS}
  columns: list[tuple[str, str]] = []
  for key, heading in [c for scorer in scorers.values() for c in scorer.eval_columns] + list(
      _ALWAYS_SHOWN):
    if key not in {shown for shown, _ in columns} and any(
        key in metrics for metrics in results.values()):
      columns.append((key, heading))
  rows = [["set"] + [heading for _, heading in columns]]
  for name, metrics in results.items():
    rows.append([name] + [_format(key, metrics.get(key)) for key, _ in columns])
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return "\n".join("  " + "  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                                    for i, (cell, width) in enumerate(zip(row, widths)))
                   for row in rows)


def _format(key: str, value: float | None) -> str:
  if value is None:
    return "-"
  if key == "tokens":
    return f"{value:,.0f}"
  if key == "seconds":
    return f"{value:.1f}"
  if key == "perplexity":
    return f"{value:.4g}" if value < 1e6 else f"{value:.3e}"
  return f"{value:.4f}"


def jsonl_path(root: epath.Path, name: str) -> epath.Path:
  """Where set `name`'s rows go under `root` (the job dir for training, JOB/eval for the
  eval program)."""
  return root / f"eval_{name}.jsonl"


def summaries_dir(root: epath.Path, name: str) -> epath.Path:
  """Set `name`'s TensorBoard folder under `root`: `summaries/eval_<name>`, as Pax names it."""
  return root / "summaries" / f"eval_{name}"


class SetWriters:
  """One `summaries.MetricsWriter` per eval set, committed and rolled back together."""

  def __init__(self, root: epath.Path, names: list[str], enabled: bool,
               resumed_from: int | None):
    self.root = root
    self._writers = {name: summaries.MetricsWriter(jsonl_path(root, name),
                                                   summaries_dir(root, name), enabled=enabled,
                                                   resumed_from=resumed_from)
                     for name in names}

  def write(self, step: int, results: Mapping[str, Mapping[str, float]]) -> None:
    for name, metrics in results.items():
      self._writers[name].write(step, metrics)

  def flush(self) -> None:
    for writer in self._writers.values():
      writer.flush()

  def commit(self, step: int | None = None) -> None:
    """Every set's rows up to `step` are kept (see MetricsWriter.commit): each set's, even
    when one set's rewrite fails (that OSError is raised after)."""
    _each_then_raise(lambda writer: writer.commit(step), self._writers.values())

  def rollback(self) -> None:
    _each_then_raise(lambda writer: writer.rollback(), self._writers.values())

  def close(self) -> None:
    _each_then_raise(lambda writer: writer.close(), self._writers.values())


def _each_then_raise(call: Callable[[summaries.MetricsWriter], None],
                     writers: Iterable[summaries.MetricsWriter]) -> None:
  """`call(writer)` for every writer; the first OSError is raised once all were called."""
  failure = None
  for writer in writers:
    try:
      call(writer)
    except OSError as e:
      failure = failure or e
  if failure is not None:
    raise failure
