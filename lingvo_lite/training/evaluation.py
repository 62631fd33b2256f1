"""One pass over each eval set of a Setup: the metrics, their table, and the files they go to.

A set's pass sums the eval step's per-token statistics over its batches, on the devices, and
divides once at the end, so every token weighs the same whatever batch it fell in:

  loss            mean next-token cross-entropy in nats over the weighted (non-padding) tokens
  perplexity      exp(loss) (inf past float64's range)
  accuracy        fraction of weighted tokens whose target's logit is the largest (ties count)
  bits_per_token  loss / ln 2
  tokens          weighted tokens evaluated
  bytes           UTF-8 bytes of text those tokens stand for (sources with `token_bytes`)
  bits_per_byte   total nats / ln 2 / bytes: comparable across vocabularies (bytes vs
                  SentencePiece), since both sides count the same text
  seconds         wall time of the pass, which the train program keeps out of its step time
  tokens_per_s    tokens / seconds

A pass with no weighted token (or no text byte) reports NaN for the means it cannot take.

A set with `num_batches=None` is its whole split: ceil(examples / batch) batches, the rows of
the last one past the split's end weighing 0, so no example counts twice. Such a pass visits
every document, so it also runs the seqio score metric functions its task defines (`(targets,
scores)`), as seqio's evaluator would: `targets` each document's text (decoded, through the
task's postprocessor), `scores` its log-likelihood (the sum over its weighted tokens, in
nats). Their results join the set's metrics. Prediction metrics need generated text, which an
eval pass does not make; they are left out with a note, as score metrics are on a sampled pass.
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
from lingvo_lite.training.steps import model_statistics

# The metrics a results table shows, with their headings (others stay in the files).
_SHOWN = (("loss", "loss"), ("perplexity", "perplexity"), ("accuracy", "accuracy"),
          ("bits_per_token", "bits/token"), ("bits_per_byte", "bits/byte"),
          ("reward_margin", "margin"), ("reward_accuracy", "reward acc."),
          ("preference_accuracy", "pref. acc."), ("tokens", "tokens"), ("seconds", "seconds"))


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
                 set_name: str = "", frozen: Any = None) -> dict[str, float]:
  """One pass of `source` with `jitted`'s eval step (a jitted.JittedSteps); `frozen`: the
  frozen parameters its steps read (a LoRA base, a DPO reference), or None. A set of
  preference pairs (data/preference_data.py) is scored by DPO's measures instead
  (`_evaluate_pairs`)."""
  if getattr(source, "document_pairs", False):
    return _evaluate_pairs(jitted, params, source, set_name, frozen)
  started = time.perf_counter()
  num_batches, examples = pass_length(source)
  scores, score_fns = _document_scores(source, set_name, examples is not None)
  token_bytes = getattr(source, "token_bytes", None)
  process, processes = jax.process_index(), jax.process_count()
  rows = local_rows(source.global_batch_size, process, processes)
  totals: dict[str, float] = {}
  text_bytes = 0.0
  with progress.Progress(f"eval {set_name}" if set_name else "eval", total=num_batches,
                         unit="batches") as bar:
    for step in range(num_batches):
      local = source.batch(step, process, processes)
      if examples is not None and (step + 1) * source.global_batch_size > examples:
        past_end = step * source.global_batch_size + rows >= examples
        local = {**local, "weights": np.where(past_end[:, None], 0.0, local["weights"]).astype(
            np.float32)}
      if token_bytes is not None:
        text_bytes += float(np.sum(token_bytes[local["targets"]] * (local["weights"] > 0)))
      if scores is None:
        sums = jitted.eval_step(params, jitted.global_batch(local), frozen)
      else:
        sums = dict(jitted.eval_token_step(params, jitted.global_batch(local), frozen))
        token_nats = sums.pop("token_nats")
        if processes > 1:  # Every process scores every row: the documents need them all.
          from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
          token_nats = multihost_utils.process_allgather(token_nats, tiled=True)
        scores.add(step, np.asarray(token_nats))
      for key, value in jax.device_get(sums).items():
        totals[key] = totals.get(key, 0.0) + float(value)
      bar.update()
  weight = totals["weight_sum"]
  # A pass without a weighted token (or text byte) has no mean: NaN, not a perfect score.
  loss = totals["cross_entropy_sum"] / weight if weight else math.nan
  metrics = {
      "loss": loss,
      "perplexity": math.exp(loss) if loss < 709.0 else math.inf,  # float64's largest exp.
      "accuracy": totals["correct_sum"] / weight if weight else math.nan,
      "bits_per_token": loss / math.log(2.0),
      "tokens": weight,
      **(model_statistics(totals, weight) if weight else {}),
  }
  if token_bytes is not None:
    if processes > 1:
      text_bytes = _sum_over_processes(int(text_bytes))
    metrics["bytes"] = text_bytes
    metrics["bits_per_byte"] = (totals["cross_entropy_sum"] / math.log(2.0) / text_bytes
                                if text_bytes else math.nan)
  if scores is not None:
    for key, value in scores.metrics(score_fns, set_name).items():
      metrics[key if key not in metrics else f"task_{key}"] = value
  seconds = time.perf_counter() - started
  metrics["seconds"] = seconds
  metrics["tokens_per_s"] = metrics["tokens"] / max(seconds, 1e-9)
  return metrics


def _evaluate_pairs(jitted: Any, params: Any, source: DataSource, set_name: str,
                    frozen: Any) -> dict[str, float]:
  """One pass over a set of preference pairs: DPO's loss, rewards, margin and reward accuracy
  against the job's reference (training/dpo.py), and the policy's own preference accuracy
  (log p(chosen) > log p(rejected)); without a reference (a job that is not DPO's) the
  rewards are 0 and only the preference accuracy says anything. `tokens` counts the scored
  (response) tokens."""
  from lingvo_lite.training import dpo  # pylint: disable=g-import-not-at-top
  started = time.perf_counter()
  num_batches, examples = pass_length(source)
  reference = frozen if jitted.setup.train.objective == "dpo" or jitted.adapters else None
  process, processes = jax.process_index(), jax.process_count()
  rows = local_rows(source.global_batch_size, process, processes)
  totals: dict[str, float] = {}
  tokens = 0.0
  with progress.Progress(f"eval {set_name}" if set_name else "eval", total=num_batches,
                         unit="batches") as bar:
    for step in range(num_batches):
      local = source.batch(step, process, processes)
      if examples is not None and (step + 1) * source.global_batch_size > examples:
        past_end = step * source.global_batch_size + rows >= examples  # Their pairs drop out.
        local = {**local, "weights": np.where(past_end[:, None], 0.0, local["weights"]).astype(
            np.float32)}
      tokens += float(np.sum(local["weights"]))
      sums = jitted.preference_eval_step(params, jitted.global_batch(local), reference)
      for key, value in jax.device_get(sums).items():
        totals[key] = totals.get(key, 0.0) + float(value)
      bar.update()
  if processes > 1:
    tokens = _sum_over_processes(int(tokens))
  metrics = {key: float(value) for key, value in dpo.metrics(totals).items()}
  if not totals["pairs"]:
    metrics = {key: (math.nan if key != "pairs" else 0.0) for key in metrics}
  metrics["tokens"] = tokens
  metrics["seconds"] = time.perf_counter() - started
  metrics["tokens_per_s"] = tokens / max(metrics["seconds"], 1e-9)
  return metrics


def _sum_over_processes(count: int) -> float:
  """Each process's own rows' count, summed exactly: JAX gathers 32-bit values (x64 off), so
  the count travels as two 30-bit halves."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  halves = multihost_utils.process_allgather(np.asarray(divmod(count, 1 << 30), np.int32))
  return float(sum(int(high) * (1 << 30) + int(low) for high, low in np.reshape(halves, (-1, 2))))


def evaluate_sets(jitted: Any, params: Any, sets: Mapping[str, DataSource],
                  frozen: Any = None) -> dict[str, dict[str, float]]:
  """Each set's metrics, by name, in the sets' order (`frozen`: as for `evaluate_set`)."""
  return {name: evaluate_set(jitted, params, source, name, frozen)
          for name, source in sets.items()}


def summary(metrics: Mapping[str, float]) -> str:
  """A set's metrics in one line: loss, bits per token and byte, accuracy; for preference
  pairs, DPO's loss, reward margin and accuracy, and the policy's preference accuracy."""
  if "reward_margin" in metrics:
    return (f"DPO loss {metrics['loss']:.4f}  reward margin {metrics['reward_margin']:.4f}  "
            f"reward accuracy {metrics['reward_accuracy']:.4f}  preference accuracy "
            f"{metrics['preference_accuracy']:.4f} ({metrics['pairs']:,.0f} pairs)")
  return (f"loss {metrics['loss']:.4f}  bits/token {metrics['bits_per_token']:.4f}  "
          + (f"bits/byte {metrics['bits_per_byte']:.4f}  " if "bits_per_byte" in metrics
             else "")
          + f"accuracy {metrics['accuracy']:.4f}")


def table(results: Mapping[str, Mapping[str, float]]) -> str:
  """The results as an aligned table, one row per set (missing metrics shown as '-')."""
  columns = [(key, heading) for key, heading in _SHOWN
             if any(key in metrics for metrics in results.values())]
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
