"""The run report's pages: one self-contained HTML file each (inline CSS, plots as data URIs,
no script, no external URL), readable offline and from a copied job dir.

Everything shown is escaped: config values, prompts and completions are users' text. The
page marks what a reader or a test looks for: the final train loss (`id="final-train-loss"`,
its exact value in `data-value`), config rows that differ from the experiment's defaults
(`class="changed"`), checkpoint statuses (`class="status-verified"`, `-failed`, ...) and each
section's `id`. Numbers are read through report.job_data.number, so a crafted or damaged value
(a string, an integer no float holds) is shown as `-` or an infinity, never a crash.

Longer than 300 lines with a reason: each section of a page is one short function over the same
escaping, number and table helpers, which the index page and the compare page both use.
"""

from __future__ import annotations

import datetime
import html
import math
import shlex
import statistics
from typing import Any, Sequence

from lingvo_lite.config.diffs import JobConfig
from lingvo_lite.report.job_data import (BEING_WRITTEN, FAILED, INCOMPLETE, SET_ASIDE, VERIFIED,
                                         Checkpoint, Job, finite, number, printable)
from lingvo_lite.report.plots import Plot, color

EVAL_ROWS_SHOWN = 200  # The newest rows of an eval table; older ones are counted.
_STATUS_CLASS = {VERIFIED: "status-verified", FAILED: "status-failed",
                 BEING_WRITTEN: "status-writing", INCOMPLETE: "status-incomplete",
                 SET_ASIDE: "status-aside"}
_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
 max-width:1200px;padding:16px 24px;color:#1d1d1f;font-size:14px;line-height:1.4}
h1{font-size:22px;margin:4px 0}h2{font-size:17px;margin:28px 0 8px;
 border-bottom:1px solid #ddd;padding-bottom:4px}h3{font-size:14px;margin:16px 0 6px}
.meta,.note{color:#666}.note{font-style:italic}
nav a{margin-right:12px}
table{border-collapse:collapse;margin:6px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
table.kv th{width:170px}
.config td{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
tr.changed td{background:#fff3c4}
.status-verified{color:#137333;font-weight:600}.status-failed{color:#b3261e;font-weight:600}
.status-writing,.status-incomplete,.status-aside{color:#9a6700;font-weight:600}
.plots{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:10px}
figure{margin:0;border:1px solid #eee;padding:4px}figure img{width:100%;height:auto}
figcaption{font-size:12px;color:#666}
.summary{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:150px}
.card .label{color:#666;font-size:12px}.card .value{font-size:20px;font-weight:600}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f9;padding:6px;margin:2px 0;
 font-size:12px;max-height:220px;overflow:auto}
.sample .completion{background:#e6f4ea}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:6px;
 vertical-align:middle}
"""


def _e(value: Any) -> str:
  return html.escape(printable(value), quote=True)


def number_text(value: float | None, digits: int = 4) -> str:
  """A number for a table cell: `-` for none, integers as such, others to `digits` decimals
  (large ones with thousands separators)."""
  if value is None:
    return "-"
  if not math.isfinite(value):
    return str(value)
  if float(value).is_integer() and abs(value) < 1e15:
    return f"{int(value):,}"
  if abs(value) >= 1e4:
    return f"{value:,.1f}"
  if abs(value) < 10 ** -digits:
    return f"{value:.{digits - 1}e}"
  return f"{value:.{digits}f}"


def _time(seconds: float | None) -> str:
  try:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
  except (TypeError, ValueError, OverflowError, OSError):  # None, NaN, or out of range.
    return "-"
  return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _bytes(size: float | None) -> str:
  if size is None:
    return "-"
  if not math.isfinite(size):
    return str(size)
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if size >= scale:
      return f"{size / scale:.1f} {unit}"
  return f"{size:.0f} B"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], classes: str = "",
           row_classes: Sequence[str] | None = None, attributes: str = "") -> str:
  """A table of already-escaped cells (each cell is HTML: `<td>` markup is added here)."""
  head = "".join(f"<th>{_e(h)}</th>" for h in headers)
  body = []
  for index, row in enumerate(rows):
    extra = f' class="{row_classes[index]}"' if row_classes and row_classes[index] else ""
    body.append(f"<tr{extra}>" + "".join(row) + "</tr>")
  return (f'<table class="{classes}"{attributes}><thead><tr>{head}</tr></thead><tbody>'
          + "".join(body) + "</tbody></table>")


def _td(text: Any, numeric: bool = False, klass: str = "", title: str = "") -> str:
  classes = " ".join(filter(None, ("num" if numeric else "", klass)))
  extra = (f' class="{classes}"' if classes else "") + (f' title="{_e(title)}"' if title
                                                        else "")
  return f"<td{extra}>{_e(text)}</td>"


def _kv(pairs: Sequence[tuple[str, str]]) -> str:
  return ('<table class="kv"><tbody>' + "".join(
      f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs) + "</tbody></table>")


def _page(title: str, sections: Sequence[tuple[str, str, str]], header: str) -> str:
  """The document: `sections` are (id, heading, inner HTML)."""
  nav = " ".join(f'<a href="#{_e(i)}">{_e(h)}</a>' for i, h, _ in sections)
  body = "".join(f'<section id="{_e(i)}"><h2>{_e(h)}</h2>{inner}</section>'
                 for i, h, inner in sections)
  return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
          f'<meta name="viewport" content="width=device-width, initial-scale=1">'
          f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
          f"{header}<nav>{nav}</nav>{body}</body></html>\n")


# ----------------------------------------------------------------------------- sections


def _command(argv: Any) -> str:
  """The recorded argv as a shell line; `python -m lingvo_lite` for the module's own path."""
  if not isinstance(argv, list) or not argv:
    return "-"
  words = [str(word) for word in argv]
  if words[0].endswith(("lingvo_lite/__main__.py", "lingvo_lite\\__main__.py")):
    words[:1] = ["python", "-m", "lingvo_lite"]
  return shlex.join(words)


def _identity(job: Job, config: JobConfig) -> str:
  if not job.starts:
    return _kv([("experiment", config.experiment or "not recorded"),
                ("run identity", "not recorded (no run_info.jsonl: a job trained before "
                 "lingvo_lite recorded it)")])
  newest = job.starts[-1]
  versions = newest.get("versions") if isinstance(newest.get("versions"), dict) else {}
  commit = newest.get("git_commit")
  code = (f"{commit}{' (with uncommitted changes)' if newest.get('git_dirty') else ''}"
          if commit else "not a git checkout (no commit recorded)")
  mesh = newest.get("mesh") if isinstance(newest.get("mesh"), dict) else {}
  argv = newest.get("argv")
  pairs = [
      ("experiment", newest.get("experiment") or config.experiment or "not recorded"),
      ("started", f"{newest.get('time', '-')} at step {newest.get('start_step', '-')}"),
      ("command", _command(argv)),
      ("code", code),
      ("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v)),
      ("host", f"{newest.get('host', '-')}, {newest.get('process_count', '-')} process(es)"),
      ("devices", f"{newest.get('device_count', '-')} x {newest.get('device_kind', '-')} "
                  f"({newest.get('platform', '-')})"),
      ("mesh", " ".join(f"{k}={v}" for k, v in mesh.items()) or "-"),
  ]
  rows = []
  for start in job.starts:
    start_mesh = start.get("mesh") if isinstance(start.get("mesh"), dict) else {}
    start_versions = start.get("versions") if isinstance(start.get("versions"), dict) else {}
    rows.append([_td(start.get("time", "-")), _td(start.get("start_step", "-"), True),
                 _td(start.get("host", "-")),
                 _td(f"{start.get('device_count', '-')} x {start.get('device_kind', '-')}"),
                 _td(" ".join(f"{k}={v}" for k, v in start_mesh.items())),
                 _td(str(start.get("git_commit") or "-")[:12]),
                 _td(start_versions.get("lingvo_lite") or "-")])
  starts = _table(["time", "start step", "host", "devices", "mesh", "commit", "lingvo_lite"],
                  rows)
  return _kv(pairs) + f"<h3>Starts ({len(job.starts)})</h3>" + starts


def _final_eval_rows(job: Job) -> list[tuple[str, str, dict]]:
  rows = [(name, "training", r[-1]) for name, r in job.train_evals.items()]
  return rows + [(name, "eval program", r[-1]) for name, r in job.program_evals.items()]


def _card(label: str, value_html: str, detail: str = "") -> str:
  return (f'<div class="card"><div class="label">{_e(label)}</div><div class="value">'
          f'{value_html}</div><div class="label">{_e(detail)}</div></div>')


def _median(rows: Sequence[dict], key: str) -> float | None:
  values = [v for row in rows if finite(v := number(row, key))]
  return statistics.median(values) if values else None


def _summary(job: Job, total_steps: int | None) -> str:
  cards = []
  last = job.train[-1] if job.train else None
  done = last["step"] if last else 0
  total = f" / {total_steps:,}" if total_steps else ""
  cards.append(_card("steps", f"{done:,}{_e(total)}",
                     f"{100 * done / total_steps:.0f}% done" if total_steps else ""))
  if last is not None and number(last, "loss") is not None:
    loss = number(last, "loss")
    cards.append(_card("final train loss", f'<span id="final-train-loss" class="final-loss" '
                       f'data-value="{_e(repr(loss))}">{_e(number_text(loss))}</span>',
                       f"at step {done:,}"))
  else:
    cards.append(_card("final train loss", '<span id="final-train-loss">-</span>',
                       "no train rows in metrics.jsonl yet"))
  for name, source, row in _final_eval_rows(job):
    cards.append(_card(f"eval loss: {name}" + (" (eval program)" if source != "training"
                                               else ""),
                       f'<span class="final-eval-loss" data-set="{_e(name)}">'
                       f'{_e(number_text(number(row, "loss")))}</span>',
                       f"{number_text(number(row, 'bits_per_byte'))} bits/byte at step "
                       f"{row['step']:,}"))
  if last is not None:
    for key, label, scale, unit in (("tokens_per_s", "tokens/s", 1.0, ""),
                                    ("mfu", "MFU", 100.0, "%"),
                                    ("data_wait_s", "data wait", 1000.0, " ms/step")):
      value, median = number(last, key), _median(job.train, key)
      if value is None:
        continue
      shown = f"{value * scale:,.1f}{unit}" if finite(value) else str(value)
      cards.append(_card(label, _e(shown), f"median {median * scale:,.1f}{unit}"
                         if median is not None else ""))
  verified = [c.step for c in job.checkpoints if c.status == VERIFIED]
  cards.append(_card("newest verified checkpoint", _e(f"{verified[-1]:,}" if verified
                                                        else "none")))
  return f'<div class="summary">{"".join(cards)}</div>'


def _plots(plots: Sequence[Plot]) -> str:
  figures, notes = [], []
  for plot in plots:
    if plot.uri is None:
      notes.append(f'<p class="note">{_e(plot.note)}</p>')
      continue
    labels = ", ".join(plot.labels)
    figures.append(f'<figure data-quantity="{_e(plot.quantity.key)}">'
                   f'<img class="plot" src="{_e(plot.uri)}" alt="{_e(plot.quantity.title)}: '
                   f'{_e(labels)}"><figcaption>{_e(plot.quantity.title)}: {_e(labels)}'
                   "</figcaption></figure>")
  return f'<div class="plots">{"".join(figures)}</div>' + "".join(notes)


def _eval_table(name: str, file: str, rows: list[dict]) -> str:
  keys = list(dict.fromkeys(k for row in rows for k, v in row.items()
                            if k != "step" and number(row, k) is not None))
  shown = rows[-EVAL_ROWS_SHOWN:]
  body = [[_td(f"{row['step']:,}", True)] + [
      f'<td class="num" data-key="{_e(k)}">{_e(number_text(number(row, k)))}</td>'
      for k in keys] for row in shown]
  older = (f'<p class="note">{len(rows) - len(shown)} older rows are in {_e(file)}.</p>'
           if len(rows) > len(shown) else "")
  return (f"<h3>{_e(name)} <span class=\"meta\">({_e(file)})</span></h3>"
          + _table(["step", *keys], body, "eval", attributes=f' data-file="{_e(file)}"')
          + older)


def _evals(job: Job) -> str:
  parts = []
  for name, rows in job.program_evals.items():
    parts.append(_eval_table(f"{name}, eval program", f"eval/eval_{name}.jsonl", rows))
  for name, rows in job.train_evals.items():
    parts.append(_eval_table(f"{name}, during training", f"eval_{name}.jsonl", rows))
  return "".join(parts) or '<p class="note">No eval rows yet.</p>'


def _checkpoints(checkpoints: Sequence[Checkpoint]) -> str:
  if not checkpoints:
    return '<p class="note">No checkpoints yet.</p>'
  rows = []
  for c in checkpoints:
    status = f"{c.status}: {c.detail}" if c.status == FAILED else c.status
    detail = "" if c.status == FAILED else c.detail
    if c.checked is not None and c.status in (VERIFIED, FAILED):
      detail = f"{detail + '; ' if detail else ''}checked {_time(c.checked)}"
    rows.append([_td(f"{c.step:,}", True), _td(_time(c.committed)), _td(_bytes(c.size), True),
                 _td(status, klass=_STATUS_CLASS[c.status]), _td(detail)])
  return _table(["step", "committed", "size", "status", "detail"], rows, "checkpoints")


def _compile(report: dict[str, Any]) -> str:
  def get(*keys: str) -> Any:
    value: Any = report
    for key in keys:
      value = value.get(key) if isinstance(value, dict) else None
    return value

  def num(*keys: str) -> float | None:  # A number where the file has one, of any type.
    return number(get(*keys[:-1]), keys[-1])

  mesh = get("mesh") if isinstance(get("mesh"), dict) else {}
  fraction, seconds, at_50 = (num("margin", "fraction"), num("compile_seconds"),
                              num("step_time", "seconds_at_50_mfu"))
  pairs = [("target", f"{get('target', 'name')} ({get('target', 'num_devices')} x "
                      f"{get('target', 'device_kind')})"),
           ("program", get("program")),
           ("mesh", " ".join(f"{k}={v}" for k, v in mesh.items()) or None),
           ("verdict", get("verdict")),
           ("memory per device", f"{_bytes(num('memory', 'deciding'))} of "
                                 f"{_bytes(num('target', 'memory_per_device'))}"),
           ("margin", f"{_bytes(num('margin', 'bytes'))} "
                      f"({100 * (fraction or 0):.1f}%)"
            if isinstance(get("margin"), dict) else "-"),
           ("compile time", f"{seconds:.1f} s" if finite(seconds) else "-")]
  estimated = num("estimate", "seconds")
  if finite(estimated):
    mfu_estimated = num("estimate", "mfu")
    pairs.append(("estimated step time", f"{estimated * 1000:.4g} ms, "
                  f"{get('estimate', 'dominant')} dominates"
                  + (f", MFU {100 * mfu_estimated:.1f}%" if finite(mfu_estimated) else "")))
  if finite(at_50):
    pairs.append(("step time at 50% MFU (a bound)", f"{at_50 * 1000:.3g} ms "
                  f"({number_text(num('step_time', 'tokens_per_s_per_device_at_50_mfu'))} "
                  "tokens/s per device)"))
  return _kv([(k, "-" if v is None else str(v)) for k, v in pairs]) + (
      '<p class="meta">From compile/report.json (compile/report.txt has the rest).</p>')


def _text(row: dict[str, Any], key: str) -> str:
  """A decode record's text, or its token ids where the vocabulary has no text."""
  text = row.get(key)
  if isinstance(text, str):
    return text
  ids = row.get(f"{key}_ids")
  return f"[token ids: {ids}]" if isinstance(ids, list) else ""


def _decode(job: Job) -> str:
  parts = [f'<p class="meta">From decode/{_e(job.decode_file)} (the newest; first '
           f"{len(job.decode_samples)} answers): each prompt, then its completion, "
           "highlighted.</p>"]
  for row in job.decode_samples:
    speed = number(row.get("timing"), "tokens_per_second")
    parts.append(
        f"<h3>{_e(row.get('source', '-'))} <span class=\"meta\">(checkpoint step "
        f"{_e(row.get('checkpoint_step', '-'))}, stop: {_e(row.get('stop_reason', '-'))}"
        f"{', ' + _e(number_text(speed, 1)) + ' tokens/s' if finite(speed) else ''})"
        f"</span></h3>"
        f'<pre class="sample"><span class="prompt">{_e(_text(row, "prompt"))}</span>'
        f'<span class="completion">{_e(_text(row, "completion"))}</span></pre>')
  return "".join(parts)


def _config(config: JobConfig, graph: str | None, graph_note: str | None) -> str:
  changed = len(config.changed)
  name = config.experiment.rpartition(".")[2] if config.experiment else ""
  if config.defaults_note:
    intro = f'<p class="note">{_e(config.defaults_note)}</p>'
  else:
    intro = (f'<p><span id="changed-count">{changed}</span> of {len(config.fields)} fields '
             f"differ from {_e(name)}'s defaults (highlighted; the default is shown).</p>")
  link = (f'<p><a href="{_e(graph)}">The config as a graph (SVG)</a></p>' if graph
          else f'<p class="note">No config graph: {_e(graph_note)}</p>')
  rows = [[_td(f.path), _td(f.value), _td(f.origin), _td(f.default or "")]
          for f in config.fields]
  classes = ["changed" if f.changed else "" for f in config.fields]
  return intro + link + _table(["path", "value", "origin", "default"], rows, "config",
                               classes)


def _notes(notes: Sequence[str]) -> str:
  return "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>"


# ----------------------------------------------------------------------------- pages


def index_page(job: Job, config: JobConfig, plots: Sequence[Plot], total_steps: int | None,
               graph: str | None, graph_note: str | None, generated: float) -> str:
  """The report of one job: identity, summary, plots, evals, checkpoints, compile report,
  decode samples, config."""
  experiment = config.experiment.rpartition(".")[2] if config.experiment else "no experiment"
  header = (f"<h1>Run report: {_e(job.shown)}</h1><p class=\"meta\">{_e(experiment)} - "
            f"generated {_e(_time(generated))} - metrics.jsonl last written "
            f"{_e(_time(job.metrics_written))}</p>")
  sections = [("identity", "Run", _identity(job, config)),
              ("summary", "Summary", _summary(job, total_steps)),
              ("plots", "Plots", _plots(plots)),
              ("evals", "Evaluations", _evals(job)),
              ("checkpoints", "Checkpoints", _checkpoints(job.checkpoints))]
  if job.compile_report is not None:
    sections.append(("compile", "Compile report", _compile(job.compile_report)))
  if job.decode_samples:
    sections.append(("decode", "Decode samples", _decode(job)))
  sections.append(("config", "Config", _config(config, graph, graph_note)))
  if job.notes:
    sections.append(("notes", "Notes", _notes(job.notes)))
  return _page(f"{job.shown}: run report", sections, header)


def compare_page(jobs: Sequence[Job], configs: Sequence[JobConfig],
                 differences: Sequence[tuple[str, list[str]]], plots: Sequence[Plot],
                 reports: Sequence[str | None], generated: float) -> str:
  """Several jobs side by side: each job's colour and headline numbers, the config fields
  that differ, and every plot with the jobs' curves overlaid.

  Args:
    jobs: The jobs, the first one the job dir the page is written in.
    configs: Their configs.
    differences: config.diffs.differences of the configs.
    plots: The overlaid plots.
    reports: Relative links to each job's own report page (None where it has none).
    generated: When (POSIX seconds).
  """
  rows = []
  for index, (job, config, link) in enumerate(zip(jobs, configs, reports)):
    last = job.train[-1] if job.train else {}
    evals = _final_eval_rows(job)
    swatch = f'<span class="swatch" style="background:{color(index)}"></span>'
    name = f'<a href="{_e(link)}">{_e(job.shown)}</a>' if link else _e(job.shown)
    rows.append([f"<td>{swatch}{name}</td>", _td(config.experiment or "-"),
                 _td(f"{last.get('step', 0):,}", True),
                 _td(number_text(number(last, "loss")), True, "final-loss"),
                 _td(f"{evals[0][0]}: {number_text(number(evals[0][2], 'loss'))}"
                     if evals else "-")])
  overview = _table(["job", "experiment", "steps", "final train loss", "final eval loss"],
                    rows)
  names = [job.shown for job in jobs]
  if differences:
    diff = (f'<p><span id="difference-count">{len(differences)}</span> fields differ '
            "(Fiddle's diff of each config against the first).</p>" + _table(
                ["path", *names], [[_td(path), *(_td(v) for v in values)]
                                   for path, values in differences], "config diff"))
  else:
    diff = '<p><span id="difference-count">0</span> fields differ: the configs are equal.</p>'
  notes = [f"{job.shown}: {note}" for job in jobs for note in job.notes]
  sections = [("jobs", "Jobs", overview), ("differences", "Config differences", diff),
              ("plots", "Plots", _plots(plots))]
  if notes:
    sections.append(("notes", "Notes", _notes(notes)))
  header = (f"<h1>Comparison: {_e(' vs '.join(names))}</h1>"
            f'<p class="meta">generated {_e(_time(generated))}</p>')
  return _page(f"{' vs '.join(names)}: comparison", sections, header)
