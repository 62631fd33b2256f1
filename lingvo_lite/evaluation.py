"""One pass over each eval set of a Setup: the metrics, their table, and the files they go to.

A set's pass sums the eval step's per-token statistics over its batches, on the devices, and
divides once at the end, so every token weighs the same whatever batch it fell in:

  loss            mean next-token cross-entropy in nats over the weighted (non-padding) tokens
  perplexity      exp(loss)
  accuracy        fraction of weighted tokens whose target is the argmax
  bits_per_token  loss / ln 2
  tokens          weighted tokens evaluated
  bytes           UTF-8 bytes of text those tokens stand for (sources with `token_bytes`)
  bits_per_byte   total nats / ln 2 / bytes: comparable across vocabularies (bytes vs
                  SentencePiece), since both sides count the same text
  seconds         wall time of the pass, which the train program keeps out of its step time
  tokens_per_s    tokens / seconds

A set with `num_batches=None` is its whole split: ceil(examples / batch) batches, the rows of
the last one past the split's end weighing 0, so no example counts twice.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath

from lingvo_lite import summaries
from lingvo_lite.data.source import DataSource, local_rows

# The metrics a results table shows, with their headings (others stay in the files).
_SHOWN = (("loss", "loss"), ("perplexity", "perplexity"), ("accuracy", "accuracy"),
          ("bits_per_token", "bits/token"), ("bits_per_byte", "bits/byte"),
          ("tokens", "tokens"), ("seconds", "seconds"))


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


def evaluate_set(jitted: Any, params: Any, source: DataSource) -> dict[str, float]:
  """One pass of `source` with `jitted`'s eval step (a programs.jitted.JittedSteps)."""
  started = time.perf_counter()
  num_batches, examples = pass_length(source)
  token_bytes = getattr(source, "token_bytes", None)
  process, processes = jax.process_index(), jax.process_count()
  rows = local_rows(source.global_batch_size, process, processes)
  totals: dict[str, float] = {}
  text_bytes = 0.0
  for step in range(num_batches):
    local = source.batch(step, process, processes)
    if examples is not None and (step + 1) * source.global_batch_size > examples:
      past_end = step * source.global_batch_size + rows >= examples
      local = {**local, "weights": np.where(past_end[:, None], 0.0, local["weights"]).astype(
          np.float32)}
    if token_bytes is not None:
      text_bytes += float(np.sum(token_bytes[local["targets"]] * (local["weights"] > 0)))
    sums = jitted.eval_step(params, jitted.global_batch(local))
    for key, value in jax.device_get(sums).items():
      totals[key] = totals.get(key, 0.0) + float(value)
  weight = max(totals["weight_sum"], 1.0)
  loss = totals["cross_entropy_sum"] / weight
  metrics = {
      "loss": loss,
      "perplexity": math.exp(min(loss, 700.0)),  # exp overflows float64 past ~709.
      "accuracy": totals["correct_sum"] / weight,
      "bits_per_token": loss / math.log(2.0),
      "tokens": totals["weight_sum"],
  }
  if token_bytes is not None:
    if processes > 1:  # Each process counted its own rows' text.
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      text_bytes = float(np.sum(multihost_utils.process_allgather(np.float64(text_bytes))))
    metrics["bytes"] = text_bytes
    metrics["bits_per_byte"] = totals["cross_entropy_sum"] / math.log(2.0) / max(text_bytes, 1.0)
  seconds = time.perf_counter() - started
  metrics["seconds"] = seconds
  metrics["tokens_per_s"] = metrics["tokens"] / max(seconds, 1e-9)
  return metrics


def evaluate_sets(jitted: Any, params: Any, sets: Mapping[str, DataSource]
                  ) -> dict[str, dict[str, float]]:
  """Each set's metrics, by name, in the sets' order."""
  return {name: evaluate_set(jitted, params, source) for name, source in sets.items()}


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

  def commit(self) -> None:
    for writer in self._writers.values():
      writer.commit()

  def rollback(self) -> None:
    for writer in self._writers.values():
      writer.rollback()

  def close(self) -> None:
    for writer in self._writers.values():
      writer.close()
