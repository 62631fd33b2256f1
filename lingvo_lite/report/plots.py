"""The run report's plots: one quantity against the step per plot, as SVG in a data URI.

Drawn with matplotlib's object API (`Figure` and the SVG canvas, never pyplot), so no
backend is chosen and no global figure state is touched for anyone else in the process; its
settings apply through `rc_context` for the drawing only. SVG keeps the curves sharp at any
zoom and its text as text (a reader can search the legend); a curve longer than
MAX_POINTS is thinned to each bucket's lowest and highest point, so spikes stay visible and
the page stays light.

Every label is drawn as the text it is: math text is off (a job dir named `$x$` is not
typeset) and the legend is given its labels explicitly (matplotlib would leave out a label
that starts with `_`, as a compared job dir `_b` does).
"""

from __future__ import annotations

import base64
import colorsys
import dataclasses
import io
import math
from typing import Any, Sequence

import numpy as np

from lingvo_lite.report.job_data import Job, number, printable
from lingvo_lite.training import objectives as objectives_lib

MAX_POINTS = 2000
_WIDTH_IN, _HEIGHT_IN = 6.0, 3.2
# matplotlib's default cycle (tab10), for the first jobs compared.
_CYCLE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")
_GOLDEN = (5 ** 0.5 - 1) / 2
_STYLE = {
    "text.parse_math": False,  # Labels are job dirs and file names, never math.
    "svg.fonttype": "none",  # Text as <text>, in the browser's font, not glyph outlines.
    "svg.hashsalt": "lingvo_lite",  # The same plot gives the same SVG.
    "font.size": 9.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def color(index: int) -> str:
  """The colour of the `index`th job of a comparison, as `#rrggbb`: tab10's, then hues spaced
  by the golden ratio (each one away from all before it) at three lightnesses, so that no two
  jobs of any count share a colour."""
  if index < len(_CYCLE):
    return _CYCLE[index]
  extra = index - len(_CYCLE)
  hue = (extra * _GOLDEN) % 1.0
  lightness = (0.45, 0.3, 0.6)[extra % 3]
  red, green, blue = colorsys.hls_to_rgb(hue, lightness, 0.75)
  return "#" + "".join(f"{round(channel * 255):02x}" for channel in (red, green, blue))


@dataclasses.dataclass(frozen=True)
class Curve:
  """One line of a plot.

  Attributes:
    label: The legend's name for it.
    steps: The x values (training steps).
    values: The y values; NaN or infinite ones are left out (a gap in the line).
    color: A matplotlib colour (None: the next of the default cycle).
    dashed: Drawn dashed with a marker at each point (eval rows: few, far apart).
  """

  label: str
  steps: Sequence[float]
  values: Sequence[float]
  color: str | None = None
  dashed: bool = False


def thin(steps: Sequence[float], values: Sequence[float],
         limit: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
  """At most `limit` points of the curve: the lowest and the highest of each of `limit // 2`
  consecutive buckets, in step order, so the curve's envelope (its spikes) stays."""
  x, y = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
  keep = np.isfinite(x) & np.isfinite(y)
  x, y = x[keep], y[keep]
  if len(x) <= limit:
    return x, y
  chosen = []
  for bucket in np.array_split(np.arange(len(x)), max(limit // 2, 1)):
    low, high = bucket[np.argmin(y[bucket])], bucket[np.argmax(y[bucket])]
    chosen.extend(sorted({int(low), int(high)}))
  return x[chosen], y[chosen]


def svg(title: str, ylabel: str, curves: Sequence[Curve]) -> str:
  """The plot as an SVG document."""
  # Imported here: only the report draws, and matplotlib takes ~0.3 s to import.
  import matplotlib  # pylint: disable=g-import-not-at-top
  from matplotlib.backends.backend_svg import FigureCanvasSVG  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  with matplotlib.rc_context(_STYLE):
    figure = Figure(figsize=(_WIDTH_IN, _HEIGHT_IN))
    # Fixed margins: a layout engine measures every text and takes most of the drawing time.
    figure.subplots_adjust(left=0.13, right=0.98, top=0.9, bottom=0.15)
    FigureCanvasSVG(figure)
    axes = figure.add_subplot()
    lines = []
    for curve in curves:
      x, y = thin(curve.steps, curve.values)
      if curve.dashed:
        (line,) = axes.plot(x, y, color=curve.color, linestyle="--", marker="o", markersize=3,
                            linewidth=1.2)
      else:
        (line,) = axes.plot(x, y, color=curve.color, linewidth=1.2)
      lines.append(line)
    axes.set_title(title)
    axes.set_xlabel("step")
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    if len(curves) > 1:
      axes.legend(lines, [printable(curve.label) for curve in curves], fontsize=8)
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
  return buffer.getvalue()


def data_uri(svg_text: str) -> str:
  """An SVG document as a `data:` URI for an <img> (an image, not markup in the page: its ids
  and styles cannot clash with the page's or another plot's)."""
  return "data:image/svg+xml;base64," + base64.b64encode(svg_text.encode()).decode("ascii")


def has_points(curves: Sequence[Curve]) -> bool:
  """Whether any curve has a finite point to draw."""
  return any(math.isfinite(s) and math.isfinite(v)
             for c in curves for s, v in zip(c.steps, c.values))


# ----------------------------------------------------------------------------- the report's


@dataclasses.dataclass(frozen=True)
class Quantity:
  """What one plot shows.

  Attributes:
    key: The row key (in metrics.jsonl, eval_<set>.jsonl or both).
    title: The plot's title.
    ylabel: The y axis's label.
    train: Drawn from the train rows.
    evals: Drawn from every eval set's rows (the training run's and the eval program's).
    scale: Multiplies the values (MFU as a percentage).
    optional: Drawn only for a job that has such rows (an objective's own metrics: DPO's
      rewards), with no note otherwise.
  """

  key: str
  title: str
  ylabel: str
  train: bool = True
  evals: bool = False
  scale: float = 1.0
  optional: bool = False


QUANTITIES = (
    Quantity("loss", "Loss", "cross-entropy (nats per token)", evals=True),
    Quantity("bits_per_byte", "Bits per byte (eval)", "bits per UTF-8 byte", train=False,
             evals=True),
    Quantity("learning_rate", "Learning rate", "learning rate"),
    Quantity("grad_norm", "Gradient norm", "global L2 norm"),
    Quantity("tokens_per_s", "Throughput", "tokens per second"),
    Quantity("mfu", "MFU", "model FLOPs utilization (%)", scale=100.0),
    Quantity("data_wait_s", "Data wait", "seconds per step waiting for data"),
)


def objective_quantities(objectives: Sequence[Any] = ()) -> list[Quantity]:
  """The plots the objectives declare (`plots`: training/objectives/objective.py), each drawn
  where a job has such rows: of the objectives that score eval sets
  (`training.objectives.SCORERS`) and of `objectives` (the jobs' own, classes or parts)."""
  found: list[Quantity] = []
  for objective in [*objectives_lib.SCORERS, *objectives]:
    for plotted in getattr(objective, "plots", ()):
      if plotted.key not in {q.key for q in QUANTITIES} | {q.key for q in found}:
        found.append(Quantity(plotted.key, plotted.title, plotted.ylabel, train=plotted.train,
                              evals=plotted.evals, optional=True))
  return found


@dataclasses.dataclass(frozen=True)
class Plot:
  """One plot of the page, or the note that stands in for it.

  Attributes:
    quantity: What it shows.
    uri: The SVG as a data URI; None when nothing could be drawn.
    note: Why it is missing (when `uri` is None).
    labels: Its curves' legend labels.
  """

  quantity: Quantity
  uri: str | None
  note: str | None
  labels: tuple[str, ...]


def _points(rows: Sequence[dict], key: str, scale: float) -> tuple[list[float], list[float]]:
  steps, values = [], []
  for row in rows:
    value = number(row, key)
    if value is not None:
      steps.append(float(row["step"]))
      values.append(value * scale)
  return steps, values


def _eval_sets(job: Job) -> list[tuple[str, list[dict]]]:
  """(label suffix, rows) of each eval set: the training run's, then the eval program's."""
  sets = [(name, rows) for name, rows in job.train_evals.items()]
  sets += [(f"{name} (--mode=eval)", rows) for name, rows in job.program_evals.items()]
  return sets


def curves(quantity: Quantity, jobs: Sequence[Job]) -> list[Curve]:
  """The quantity's curves: one job's in the default colours, several jobs' in one colour
  each (train solid, evals dashed), labelled by the job dir."""
  found = []
  for index, job in enumerate(jobs):
    job_color = color(index) if len(jobs) > 1 else None
    prefix = f"{job.shown} " if len(jobs) > 1 else ""
    if quantity.train:
      steps, values = _points(job.train, quantity.key, quantity.scale)
      if steps:
        found.append(Curve(f"{prefix}train".strip() if prefix else "train", steps, values,
                           job_color))
    for suffix, rows in _eval_sets(job) if quantity.evals else ():
      steps, values = _points(rows, quantity.key, quantity.scale)
      if steps:
        found.append(Curve(f"{prefix}eval {suffix}", steps, values, job_color,
                           dashed=True))
  return found


# A mixture of experts' routing (models/moe_transformer.py logs each expert's share of the
# tokens' expert choices as `expert_fraction/NNN`): a heat map, experts by steps.
EXPERT_SHARES = Quantity("expert_fraction", "Expert token shares", "expert")
_EXPERT_PREFIX = EXPERT_SHARES.key + "/"


def expert_shares(rows: Sequence[dict]) -> tuple[np.ndarray, np.ndarray] | None:
  """(the steps, [experts, steps] shares) of the train rows that log every expert's share,
  experts in index order; None for a model without experts."""
  keys = sorted({key for row in rows for key in row if key.startswith(_EXPERT_PREFIX)})
  steps, columns = [], []
  for row in rows if keys else ():
    values = [number(row, key) for key in keys]
    if all(value is not None and math.isfinite(value) for value in values):
      steps.append(float(row["step"]))
      columns.append(values)
  if not steps:
    return None
  return np.asarray(steps), np.asarray(columns, dtype=np.float64).T


def heat_map_svg(title: str, steps: np.ndarray, shares: np.ndarray,
                 limit: int = MAX_POINTS) -> str:
  """Shares [experts, steps] as an SVG heat map (steps along x, experts along y, a colour
  bar), more than `limit` steps averaged in consecutive buckets."""
  if len(steps) > limit:
    buckets = np.array_split(np.arange(len(steps)), limit)
    steps = np.asarray([steps[b].mean() for b in buckets])
    shares = np.stack([shares[:, b].mean(axis=1) for b in buckets], axis=1)
  import matplotlib  # pylint: disable=g-import-not-at-top
  from matplotlib.backends.backend_svg import FigureCanvasSVG  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  with matplotlib.rc_context(_STYLE):
    figure = Figure(figsize=(_WIDTH_IN, _HEIGHT_IN))
    figure.subplots_adjust(left=0.13, right=0.98, top=0.9, bottom=0.15)
    FigureCanvasSVG(figure)
    axes = figure.add_subplot()
    half = (steps[1] - steps[0]) / 2 if len(steps) > 1 else 0.5
    image = axes.imshow(shares, aspect="auto", origin="lower", interpolation="nearest",
                        extent=(steps[0] - half, steps[-1] + half, -0.5, len(shares) - 0.5),
                        cmap="viridis")
    figure.colorbar(image, ax=axes, label="share of the expert choices")
    axes.set_title(title)
    axes.set_xlabel("step")
    axes.set_ylabel(EXPERT_SHARES.ylabel)
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
  return buffer.getvalue()


def expanded(quantities: Sequence[Quantity], jobs: Sequence[Job]) -> list[Quantity]:
  """`quantities` with each whose key ends in `*` (a family of metrics: GRPO's `reward:*`,
  one per reward function) replaced by one per key of the jobs' train rows it matches, in
  sorted order, titled with the part the `*` stands for."""
  found = []
  for quantity in quantities:
    if not quantity.key.endswith("*"):
      found.append(quantity)
      continue
    prefix = quantity.key[:-1]
    keys = sorted({key for job in jobs for row in job.train for key in row
                   if key.startswith(prefix) and len(key) > len(prefix)})
    found += [dataclasses.replace(quantity, key=key,
                                  title=f"{quantity.title}: {key[len(prefix):]}")
              for key in keys]
  return found


def plots(jobs: Sequence[Job], objectives: Sequence[Any] = ()) -> list[Plot]:
  """Every quantity's plot of `jobs` (one job, or several overlaid), the objectives' own
  where the jobs have their rows (`objective_quantities`: `objectives` are the jobs'), and one
  job's expert shares where it has experts."""
  made = []
  for quantity in expanded([*QUANTITIES, *objective_quantities(objectives)], jobs):
    found = curves(quantity, jobs)
    labels = tuple(curve.label for curve in found)
    if not has_points(found):
      if quantity.optional:
        continue
      where = " or ".join(filter(None, ("metrics.jsonl" if quantity.train else "",
                                        "eval_<set>.jsonl" if quantity.evals else "")))
      made.append(Plot(quantity, None, f"{quantity.title}: no finite {quantity.key} in "
                       f"{where} yet", labels))
      continue
    made.append(Plot(quantity, data_uri(svg(quantity.title, quantity.ylabel, found)), None, labels))
  shares = expert_shares(jobs[0].train) if len(jobs) == 1 else None
  if shares is not None:
    made.append(Plot(EXPERT_SHARES, data_uri(heat_map_svg(EXPERT_SHARES.title, *shares)), None,
                     (f"{len(shares[1])} experts, mean over the MoE layers",)))
  return made
