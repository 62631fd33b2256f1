"""`--mode=report`: the run report of a job and the comparison of jobs, end to end, in this
process (lingvo_lite.testing.run_cli), with relative paths as a user writes them.

One tiny PyCodeTiny job (the suite's shared one, tests/trained_jobs.TINY_TRAIN: checkpoints at
steps 10 and 20, evals during training; here also evaluated by the eval program, compiled and
decoded) and a second one that differs in one field serve every test. Their working directory
is made once per machine and code version for every test process (tests/conftest.py) and
copied here. Expected values come from the job's own files (metrics.jsonl, the
eval rows, compile/report.json, the decode records) and from the experiment's config, read
here, never from the report's code; pages are parsed with the standard library's HTML parser.
"""

import base64
import html.parser
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest
from etils import epath

import fiddle as fdl

from lingvo_lite import testing
from lingvo_lite.checkpoints import integrity as checkpoint_integrity
from lingvo_lite.config import diffs as config_diffs, fiddlers, registry
from lingvo_lite.programs import report as report_program
from lingvo_lite.report import job_data as report_data, plots as report_plots
from lingvo_lite.testing import run_cli
from tests import trained_jobs

JOB, OTHER = trained_jobs.TINY_JOB, "runs/b"
# The one field runs/b changes, optimizer.peak_learning_rate: JOB's value, and runs/b's.
JOB_LR = float(next(arg.partition("=")[2] for arg in trained_jobs.TINY_TRAIN
                    if arg.startswith("--fdl.optimizer.peak_learning_rate=")))
CHANGED_LR = 1e-3
# The fields TINY_TRAIN sets beyond the tiny fiddler, to values other than PyCodeTiny's.
TRAIN_CHANGES = {"train.steps", "train.eval_every_steps", "checkpoint.max_to_keep",
                 "optimizer.warmup_steps", "optimizer.peak_learning_rate"}
# A prompt that is HTML and a URL: the page must show it as text.
PROMPT = '<b class="x">def</b> & https://example.com/'
REPORT = ["--mode=report", f"--job_log_dir={JOB}"]


# ----------------------------------------------------------------------------- pages


class Node:
  def __init__(self, tag, attrs, parent):
    self.tag, self.attrs, self.parent, self.children, self.parts = tag, dict(attrs), parent, [], []

  @property
  def text(self):
    return "".join(part if isinstance(part, str) else part.text for part in self.parts)

  def all(self, tag=None, **attrs):
    """Descendants with this tag whose attributes hold these values (class: one of its)."""
    found = []
    for child in self.children:
      classes = child.attrs.get("class", "").split()
      if (tag is None or child.tag == tag) and all(
          (value in classes) if name == "klass" else child.attrs.get(name) == value
          for name, value in attrs.items()):
        found.append(child)
      found.extend(child.all(tag, **attrs))
    return found

  def one(self, tag=None, **attrs):
    found = self.all(tag, **attrs)
    assert len(found) == 1, f"{len(found)} <{tag} {attrs}> elements"
    return found[0]


class _Parser(html.parser.HTMLParser):
  VOID = {"meta", "img", "br", "hr", "link", "input"}

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.root = self.node = Node("document", {}, None)

  def handle_starttag(self, tag, attrs):
    node = Node(tag, attrs, self.node)
    self.node.children.append(node)
    self.node.parts.append(node)
    if tag not in self.VOID:
      self.node = node

  def handle_endtag(self, tag):
    node = self.node
    while node is not None and node.tag != tag:
      node = node.parent
    if node is not None and node.parent is not None:
      self.node = node.parent

  def handle_data(self, data):
    self.node.parts.append(data)


def parse(path) -> Node:
  parser = _Parser()
  parser.feed(pathlib.Path(path).read_text())
  parser.close()
  return parser.root


def table_rows(table: Node) -> list[list[str]]:
  return [[cell.text for cell in row.all("td")] for row in table.one("tbody").all("tr")]


def headers(table: Node) -> list[str]:
  return [cell.text for cell in table.one("thead").all("th")]


def jsonl(path) -> list[dict]:
  return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line]


def job_files(job) -> dict[str, bytes]:
  """Every file of the job dir but the report's own folder, with its bytes."""
  job = pathlib.Path(job)
  return {str(p.relative_to(job)): p.read_bytes() for p in sorted(job.rglob("*"))
          if p.is_file() and p.relative_to(job).parts[0] != "report"}


def plot_svg(document: Node, quantity: str) -> str:
  """The SVG text of the page's plot of `quantity`."""
  figure = document.one("figure", **{"data-quantity": quantity})
  return base64.b64decode(figure.one("img").attrs["src"].partition(",")[2]).decode()


def report(*args) -> "run_cli":
  result = run_cli(list(args))
  assert result.code == 0, result.stderr[-3000:]
  return result


def one_line_error(result) -> str:
  assert result.code == 2, (result.code, result.stderr[-2000:])
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("lingvo_lite: error: "), result.stderr
  return lines[0]


# ----------------------------------------------------------------------------- fixtures


# The working directory every test reads: JOB (trained, then evaluated, compiled, decoded) and
# runs/b (trained as JOB with another peak learning rate).
WORKDIR_COMMANDS = (
    trained_jobs.TINY_TRAIN,
    [*(arg for arg in trained_jobs.TINY_TRAIN if not arg.startswith("--job_log_dir=")),
     f"--job_log_dir={OTHER}", f"--fdl.optimizer.peak_learning_rate={CHANGED_LR}"],
    ["--mode=eval", f"--job_log_dir={JOB}"],
    ["--mode=compile", "--compile_topology=cpu:1", f"--job_log_dir={JOB}"],
    ["--mode=decode", f"--job_log_dir={JOB}", f"--prompt={PROMPT}", "--prompt=import os",
     "--fdl.decode.max_new_tokens=8"],
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, prepare_workdir):
  """A copy of the working directory WORKDIR_COMMANDS leave (see the module doc)."""
  root = tmp_path_factory.mktemp("report")
  prepare_workdir(WORKDIR_COMMANDS, root)
  assert sorted(os.listdir(root / JOB / "checkpoints"), key=int) == ["10", "20"]
  return root


@pytest.fixture(autouse=True)
def _in_workdir(workdir, monkeypatch):
  monkeypatch.chdir(workdir)


@pytest.fixture(scope="module")
def page(workdir):
  """JOB's report, made once: (the run's output, the parsed page, the job's files before)."""
  with pytest.MonkeyPatch.context() as patch:
    patch.chdir(workdir)
    before = job_files(JOB)
    result = report(*REPORT)
    return result, parse(workdir / JOB / "report" / "index.html"), before


# ----------------------------------------------------------------------------- the page


def test_writes_a_self_contained_page_and_says_where(page, workdir):
  result, document, _ = page
  assert result.stdout.splitlines() == [f"report: {JOB}/report/index.html",
                                        f"config graph: {JOB}/report/config.svg"]
  svg = (workdir / JOB / "report" / "config.svg").read_text()
  assert "<svg" in svg and "GptJ" in svg, svg[:300]
  assert document.one("a", href="config.svg")
  # No fetch of anything: images are data URIs, links stay in the page or its folder.
  for node in document.all():
    for name in ("src", "href"):
      value = node.attrs.get(name)
      if value is not None:
        assert not value.lower().startswith(("http://", "https://", "//")), (node.tag, value)
        assert name != "src" or value.startswith("data:image/svg+xml;base64,"), value[:80]
  assert not document.all("script") and not document.all("link")
  plots = document.one(id="plots").all("img")
  assert {img.parent.attrs["data-quantity"] for img in plots} == {
      "loss", "bits_per_byte", "learning_rate", "grad_norm", "tokens_per_s", "mfu",
      "data_wait_s"}
  # The loss plot has the train curve and every eval set's, by their legend labels.
  loss_svg = base64.b64decode(document.one("figure", **{"data-quantity": "loss"}).one(
      "img").attrs["src"].partition(",")[2]).decode()
  for label in ("train", "eval validation", "eval validation (--mode=eval)"):
    assert f">{label}</text>" in loss_svg, label


def test_identity_comes_from_run_info(page, workdir):
  _, document, _ = page
  rows = jsonl(workdir / JOB / "run_info.jsonl")
  identity = document.one(id="identity")
  text = identity.text
  newest = rows[-1]
  assert newest["experiment"] in text
  assert f"jax {newest['versions']['jax']}" in text
  assert (newest["git_commit"] or "not a git checkout") in text
  assert f"{newest['device_count']} x {newest['device_kind']}" in text
  starts = identity.all("table")[-1]
  assert [row[0] for row in table_rows(starts)] == [row["time"] for row in rows]


def test_summary_shows_the_last_metrics_row(page, workdir):
  _, document, _ = page
  last = jsonl(workdir / JOB / "metrics.jsonl")[-1]
  shown = document.one(id="final-train-loss")
  assert float(shown.attrs["data-value"]) == last["loss"]
  assert shown.text == f"{last['loss']:.4f}"
  summary = document.one(id="summary").text
  assert f"{last['step']:,} / 20" in summary
  for name, rows in (("validation", jsonl(workdir / JOB / "eval_validation.jsonl")),):
    losses = [n.text for n in document.all(klass="final-eval-loss") if n.attrs["data-set"] == name]
    assert f"{rows[-1]['loss']:.4f}" in losses


@pytest.mark.parametrize("file", ["eval/eval_validation.jsonl", "eval_validation.jsonl"])
def test_eval_tables_equal_the_eval_rows(page, workdir, file):
  _, document, _ = page
  rows = jsonl(workdir / JOB / file)
  table = document.one("table", **{"data-file": file})
  names = headers(table)
  shown = table_rows(table)
  assert [int(r[0].replace(",", "")) for r in shown] == [row["step"] for row in rows]
  for row, cells in zip(rows, shown):
    for key in ("loss", "perplexity", "accuracy", "bits_per_byte"):
      assert float(cells[names.index(key)]) == pytest.approx(row[key], abs=6e-5), key


def test_changed_fields_are_the_ones_the_command_line_set(page):
  _, document, _ = page
  defaults = registry.lookup("PyCodeTiny").config()
  tiny = registry.lookup("PyCodeTiny").config()
  fiddlers.tiny(tiny)
  # What the tiny fiddler changes, read off the two configs here (a field of each part).
  tiny_changes = {f"{part}.{name}" for part in ("model", "train_data", "eval_data", "train",
                                                "checkpoint", "decode")
                  if hasattr(defaults, part)
                  for name, value in getattr(tiny, part).__arguments__.items()
                  if getattr(getattr(defaults, part), name, object()) != value}
  config = document.one(id="config")
  rows = {cells[0]: cells for cells in table_rows(config.one("table"))}
  changed = {node.all("td")[0].text for node in config.all("tr", klass="changed")}
  assert changed == tiny_changes | TRAIN_CHANGES
  assert int(config.one(id="changed-count").text) == len(changed)
  assert rows["model.num_layers"][3] == repr(defaults.model.num_layers)  # The default shown.
  assert rows["train.steps"][1:3] == ["20", "command line: --fdl.train.steps=20"]
  assert rows["model.num_heads"][3] == ""  # The tiny fiddler sets it to its default: unchanged.


def test_checkpoints_are_listed_verified(page):
  _, document, _ = page
  rows = table_rows(document.one(id="checkpoints").one("table"))
  assert [(r[0], r[3]) for r in rows] == [("10", "verified"), ("20", "verified")]


def test_compile_and_decode_sections(page, workdir):
  _, document, _ = page
  compiled = json.loads((workdir / JOB / "compile" / "report.json").read_text())
  section = document.one(id="compile").text
  assert compiled["verdict"] in section and compiled["target"]["name"] in section
  (decoded,) = list((workdir / JOB / "decode").glob("*.jsonl"))
  records = jsonl(decoded)
  samples = document.one(id="decode").all("pre", klass="sample")
  assert [s.one("span", klass="prompt").text for s in samples] == [r["prompt"] for r in records]
  assert [s.one("span", klass="completion").text for s in samples] == [
      r["completion"] for r in records]
  # The prompt's markup is text: no element came from it.
  assert not document.all("b", klass="x")
  raw = (workdir / JOB / "report" / "index.html").read_text()
  assert '&lt;b class=&quot;x&quot;&gt;def&lt;/b&gt; &amp; https://example.com/' in raw


def test_sections_of_missing_files_are_left_out(workdir):
  report("--mode=report", f"--job_log_dir={OTHER}")
  document = parse(workdir / OTHER / "report" / "index.html")
  ids = {node.attrs["id"] for node in document.all("section")}
  assert {"identity", "summary", "plots", "evals", "checkpoints", "config"} <= ids
  assert not ids & {"compile", "decode"}  # runs/b was neither compiled nor decoded.


def test_report_changes_nothing_but_its_folder(page, workdir):
  _, _, before = page
  assert job_files(JOB) == before
  report(*REPORT)  # Again: the page is replaced through a rename, and nothing else changes.
  assert job_files(JOB) == before
  # No temporary file is left: each was renamed into place.
  assert set(os.listdir(workdir / JOB / "report")) - {"compare.html"} == {
      ".verified.json", "config.svg", "index.html"}


def test_no_device_is_touched(page, workdir):
  """A report starts no JAX backend (it builds no config): it can run beside a trainer that
  holds the accelerators, and on a machine with fewer devices than the job's mesh."""
  probe = ("import sys; from lingvo_lite.testing import run_cli; "
           "from jax._src import xla_bridge; "
           f"result = run_cli(['--mode=report', '--job_log_dir={JOB}']); "
           "print(result.code, xla_bridge.backends_are_initialized())")
  done = subprocess.run([sys.executable, "-c", probe], cwd=workdir, capture_output=True,
                        text=True, timeout=120, check=False,
                        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
  assert done.stdout.split()[-2:] == ["0", "False"], done.stdout + done.stderr[-2000:]


# ----------------------------------------------------------------------------- files in motion


def test_a_corrupted_checkpoint_fails_and_the_cache_does_not_hide_it(page, tmp_path):
  copy = tmp_path / "copy"
  shutil.copytree(JOB, copy)
  report("--mode=report", f"--job_log_dir={copy}")  # Verified, and remembered as such.
  data = max((p for p in (copy / "checkpoints" / "20").rglob("*") if p.is_file()
              and "/d/" in str(p)), key=lambda p: p.stat().st_size)
  with open(data, "r+b") as f:  # One byte flipped in place: same size, same inode.
    f.seek(data.stat().st_size // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))
  report("--mode=report", f"--job_log_dir={copy}")
  rows = table_rows(parse(copy / "report" / "index.html").one(id="checkpoints").one("table"))
  assert rows[0][3] == "verified"
  assert rows[1][3].startswith("FAILED: ") and str(data.relative_to(copy / "checkpoints" / "20")
                                                   ) in rows[1][3], rows[1]


def test_a_job_being_written_still_reports(page, tmp_path):
  copy = tmp_path / "copy"
  shutil.copytree(JOB, copy)
  last = jsonl(copy / "metrics.jsonl")[-1]
  with open(copy / "metrics.jsonl", "a") as f:
    f.write('{"step": 21, "loss": 1.2')  # A row still being written.
  with open(copy / "eval_validation.jsonl", "a") as f:
    f.write('{"step": 30, "lo')
  (copy / "eval_new.jsonl").write_text("")  # A set whose first row is not there yet.
  (copy / "checkpoints" / "30.orbax-checkpoint-tmp-1700000000").mkdir()  # orbax writing.
  shutil.copytree(copy / "checkpoints" / "20", copy / "checkpoints" / "40")
  (copy / "checkpoints" / "40" / "lingvo_lite_checksums.json").unlink()  # Not recorded yet.
  (copy / "run_info.jsonl").unlink()  # An older job.
  report("--mode=report", f"--job_log_dir={copy}")
  document = parse(copy / "report" / "index.html")
  assert float(document.one(id="final-train-loss").attrs["data-value"]) == last["loss"]
  rows = table_rows(document.one(id="checkpoints").one("table"))
  assert [(r[0], r[3]) for r in rows] == [("10", "verified"), ("20", "verified"),
                                          ("30", "being written"), ("40", "being written")]
  notes = document.one(id="notes").text
  assert "metrics.jsonl: its last line is being written" in notes
  assert "not recorded" in document.one(id="identity").text


def _huge_integer_loss(job):
  with open(job / "metrics.jsonl", "a") as f:  # Valid JSON; no float holds it.
    f.write('{"step": 21, "loss": 1' + "0" * 400 + "}\n")
  def check(document):
    assert document.one(id="final-train-loss").attrs["data-value"] == "inf"
  return check


def _text_tokens_per_second(job):
  (job / "decode").mkdir(exist_ok=True)  # The newest file by name: answers, x\udcff.
  (job / "decode" / "answers.jsonl").write_text(json.dumps(
      {"schema_version": 1, "prompt": "p\ud800", "completion": "c", "source": "s",
       "timing": {"tokens_per_second": "fast"}}) + "\n")  # A lone surrogate in the prompt too.
  def check(document):
    section = document.one(id="decode")
    assert section.one("span", klass="prompt").text == "p\\ud800"
    assert section.one("h3").text == "s (checkpoint step -, stop: -)"  # No speed shown.
  return check


def _math_and_non_utf8_names(job):
  eval_rows = (job / "eval_validation.jsonl").read_bytes()
  (job / "eval_$\\foo{$.jsonl").write_bytes(eval_rows)  # mathtext: "Unknown symbol: \foo".
  (job / "eval_x\udcff.jsonl").write_bytes(eval_rows)  # The file name's byte 0xff.
  (job / "decode").mkdir(exist_ok=True)  # The newest file by name: answers, x\udcff.
  (job / "decode" / "x\udcff.jsonl").write_text('{"schema_version": 1, "prompt": "p"}\n')
  def check(document):
    loss = plot_svg(document, "loss")
    assert ">eval $\\foo{$</text>" in loss and ">eval x\\xff</text>" in loss  # Verbatim.
    assert document.one("table", **{"data-file": "eval_x\\xff.jsonl"})
    assert "From decode/x\\xff.jsonl" in document.one(id="decode").text
  return check


def _huge_commit_time(job):
  metadata_file = job / "checkpoints" / "10" / "_CHECKPOINT_METADATA"
  metadata = json.loads(metadata_file.read_text())
  metadata_file.write_text(json.dumps(dict(metadata, commit_timestamp_nsecs=1e30)))
  def check(document):
    rows = table_rows(document.one(id="checkpoints").one("table"))
    assert rows[0][:2] == ["10", "-"] and rows[1][1].endswith(" UTC"), rows
  return check


def _compile_report_of_wrong_types(job):
  (job / "compile" / "report.json").write_text(json.dumps(
      {"target": 5, "mesh": ["data"], "verdict": "fits", "memory": {"deciding": "x"},
       "margin": {"fraction": "x", "bytes": 10**400}, "compile_seconds": "x",
       "step_time": {"seconds_at_50_mfu": "x"}, "estimate": {"seconds": "x", "mfu": [1]}}))
  def check(document):
    rows = dict([cell.text for cell in tr.all()] for tr in document.one(id="compile").all("tr"))
    assert rows == {"target": "None (None x None)", "program": "-", "mesh": "-",
                    "verdict": "fits", "memory per device": "- of -", "margin": "inf (0.0%)",
                    "compile time": "-"}
  return check


def _fifos(job):
  os.mkfifo(job / "eval_fifo.jsonl")  # Reading one would wait for a writer for ever.
  (job / "run_info.jsonl").unlink()
  os.mkfifo(job / "run_info.jsonl")
  (job / "metrics.jsonl").unlink()
  os.mkfifo(job / "metrics.jsonl")
  def check(document):
    notes = document.one(id="notes").text
    for name in ("eval_fifo.jsonl", "run_info.jsonl", "metrics.jsonl"):
      assert f"{name}: not a regular file" in notes, notes
  return check


@pytest.mark.parametrize("craft", [
    _huge_integer_loss, _text_tokens_per_second, _math_and_non_utf8_names, _huge_commit_time,
    _compile_report_of_wrong_types, _fifos])
def test_damaged_or_crafted_files_still_report(page, tmp_path, craft):
  """A job dir's damaged or crafted file, or one named oddly, is shown as it is or left out
  with a note: never a traceback."""
  copy = tmp_path / "copy"
  ignored = None if craft is _huge_commit_time else shutil.ignore_patterns("checkpoints")
  shutil.copytree(JOB, copy, ignore=ignored)
  check = craft(copy)
  report("--mode=report", f"--job_log_dir={copy}")
  check(parse(copy / "report" / "index.html"))


def _changing_after_the_first_crc(monkeypatch, step_dir, change):
  """Makes the report's verification of `step_dir` meet `change` after its first file's CRC-32,
  as a trainer's retention (or a rewrite) would meet a long verification."""
  crc32, done = checkpoint_integrity._crc32, []  # pylint: disable=protected-access

  def racing(path):
    value = crc32(path)
    if not done and str(path).startswith(f"{step_dir}/"):
      done.append(path)
      change(step_dir)
    return value

  monkeypatch.setattr(checkpoint_integrity, "_crc32", racing)
  return done


def _delete_step(step_dir):  # As Checkpointer._delete_step does: rename aside, then remove.
  doomed = step_dir.with_name(f"{step_dir.name}.lingvo_lite-deleting-1")
  step_dir.rename(doomed)
  shutil.rmtree(doomed)


def _rewrite_step(step_dir):  # Saved again by a resumed run: other bytes, other times.
  for path in sorted(p for p in step_dir.rglob("*") if p.is_file()):
    if path.name != checkpoint_integrity.CHECKSUMS_FILE:
      path.write_bytes(path.read_bytes() + b"x")


@pytest.mark.parametrize("change, note", [
    (_delete_step, None), (_rewrite_step, "checkpoints/10: changed while it was checked")])
def test_a_checkpoint_deleted_while_checked_is_left_out(page, tmp_path, monkeypatch, change,
                                                        note):
  folder = tmp_path / "checkpoints"
  shutil.copytree(pathlib.Path(JOB) / "checkpoints", folder)
  met = _changing_after_the_first_crc(monkeypatch, folder / "10", change)
  notes = []
  found, checked = report_data.read_checkpoints(epath.Path(folder), {}, 1.0, notes)
  assert met, "the verification of step 10 never read a file"
  assert [(c.step, c.status) for c in found] == [(20, report_data.VERIFIED)]
  assert set(checked) == {"20"}  # Nothing cached for the step that changed.
  assert notes == ([note + " (left out)"] if note else [])


def test_reports_while_the_run_trains(workdir):
  """Reports made in a loop while a run trains (this thread) appends metrics, saves a
  checkpoint every 5 steps (deleting all but the newest two: files vanish) and evaluates: each
  succeeds and shows a loss the trainer had written."""
  job, made, failures = "runs/live", [], []
  stop = threading.Event()

  def make_reports():
    while not stop.is_set():
      if not (workdir / job / "metrics.jsonl").exists():
        time.sleep(0.05)
        continue
      try:
        report_program.write_index(epath.Path(workdir / job), job)
        shown = parse(workdir / job / "report" / "index.html").one(id="final-train-loss")
        losses = [row["loss"] for row in jsonl(workdir / job / "metrics.jsonl")]
        assert float(shown.attrs["data-value"]) in losses, (shown.attrs, losses)
        made.append(stop.is_set())
      except Exception as e:  # pylint: disable=broad-except
        failures.append(e)
        return

  reporter = threading.Thread(target=make_reports)
  reporter.start()
  try:
    result = run_cli(["--exp=PyCodeTiny", "--fiddler=tiny", f"--job_log_dir={job}",
                      "--fdl.train.steps=100", "--fdl.train.log_every_steps=1",
                      "--fdl.train.eval_every_steps=25", "--fdl.checkpoint.every_steps=5",
                      "--fdl.checkpoint.max_to_keep=2"])
  finally:
    stop.set()
    reporter.join(timeout=60)
  assert result.code == 0, result.stderr[-3000:]
  assert not failures, failures
  assert made.count(False) >= 2, f"{made.count(False)} reports while the run trained"


def test_a_resumed_run_replaces_the_rows_past_its_restore():
  """metrics.jsonl of a run killed after step 20 and resumed from its checkpoint at 10: the
  killed run's rows past 10 stay in the file until the resumed run's first checkpoint."""
  killed = [{"step": s, "loss": float(s)} for s in (5, 10, 15, 20)]
  resumed = [{"step": s, "loss": -float(s)} for s in (15, 20, 25)]
  assert report_data.one_row_per_step(killed + resumed) == killed[:2] + resumed
  assert report_data.one_row_per_step(killed + resumed[:1]) == killed[:2] + resumed[:1]


def test_a_replaced_part_differs_only_in_its_changed_fields():
  """Fiddle's diff names the whole model where it cannot align the two (a Partial is not a
  Config); the table still lists only the model's fields whose values differ."""
  first = testing.tiny_config("PyCodeTiny")
  second = testing.tiny_config("PyCodeTiny")
  second.model = fdl.Partial(fdl.get_callable(first.model),
                             **dict(fdl.ordered_arguments(first.model), dim=32, num_heads=2))
  assert config_diffs.differences([first, second]) == [("model.dim", ["64", "32"]),
                                                         ("model.num_heads", ["4", "2"])]
  assert config_diffs.differences([first, testing.tiny_config("PyCodeTiny")]) == []


# ----------------------------------------------------------------------------- compare


def test_compare_shows_the_changed_field_and_both_runs_curves(page, workdir):
  other_before = job_files(OTHER)
  result = report(*REPORT, f"--compare={OTHER}")
  assert result.stdout.splitlines() == [f"comparison: {JOB}/report/compare.html"]
  document = parse(workdir / JOB / "report" / "compare.html")
  table = document.one(id="differences").one("table")
  assert headers(table) == ["path", JOB, OTHER]
  assert table_rows(table) == [["optimizer.peak_learning_rate", repr(JOB_LR),
                                repr(CHANGED_LR)]]
  jobs = table_rows(document.one(id="jobs").one("table"))
  assert [row[0] for row in jobs] == [JOB, OTHER]
  assert [row[3] for row in jobs] == [f"{jsonl(workdir / j / 'metrics.jsonl')[-1]['loss']:.4f}"
                                      for j in (JOB, OTHER)]
  for quantity in ("loss", "learning_rate"):
    figure = document.one("figure", **{"data-quantity": quantity})
    svg = base64.b64decode(figure.one("img").attrs["src"].partition(",")[2]).decode()
    for job, color in ((JOB, "#1f77b4"), (OTHER, "#ff7f0e")):  # One colour per job.
      assert f">{job} train</text>" in svg, (quantity, job)
      assert f"stroke: {color}" in svg, (quantity, color)
  # The compared job is only read.
  assert job_files(OTHER) == other_before
  assert not (workdir / OTHER / "report" / "compare.html").exists()


@pytest.mark.parametrize("args, named", [
    (["--job_log_dir=runs/missing"], "--job_log_dir=runs/missing: no such folder"),
    (["--job_log_dir=empty"], "--job_log_dir=empty: holds no config.json"),
    (["--job_log_dir=a_file"], "--job_log_dir=a_file: is a file"),
    ([f"--job_log_dir={JOB}", "--compare=runs/missing"], "--compare=runs/missing: no such"),
    ([f"--job_log_dir={JOB}", "--compare=empty"], "--compare=empty: holds no config.json"),
    ([f"--job_log_dir={JOB}", f"--compare={JOB}"], f"--compare={JOB}: is --job_log_dir"),
    ([f"--job_log_dir={JOB}", "--compare="], "--compare=: names no job dir"),
    ([f"--job_log_dir={JOB}", "--compare=runs/b,,"], "--compare=runs/b,,: item 2 is empty"),
    ([f"--job_log_dir={JOB}", "--compare=,runs/b"], "--compare=,runs/b: item 1 is empty"),
    ([f"--job_log_dir={JOB}", "--compare=runs/alink"], "--compare=runs/alink: is --job_log_dir"),
    ([f"--job_log_dir={JOB}", "--compare=runs/b,runs/alink/../b"],
     "--compare=runs/alink/../b: names the same job dir twice"),
    (["--job_log_dir=fifo_config"], "fifo_config/config.json is a FIFO (named pipe), not a regular "
     "file"),
    ([f"--job_log_dir={JOB}", "--exp=PyCodeTiny"], "--exp: --mode=report takes no config"),
    ([f"--job_log_dir={JOB}", "--fdl.model.dim=8"], "--mode=report takes no config (it is the "
     "mode to write JOB/report/index.html, "),
    (["--compare=runs/b"], "--job_log_dir: required"),
    (["--job_log_dir=report_is_a_file"], "report_is_a_file/report is a file, not a folder"),
])
def test_what_cannot_be_reported_is_one_line(workdir, args, named):
  (workdir / "empty").mkdir(exist_ok=True)
  (workdir / "a_file").write_text("x")
  (workdir / "report_is_a_file").mkdir(exist_ok=True)
  shutil.copy(workdir / JOB / "config.json", workdir / "report_is_a_file")
  (workdir / "report_is_a_file" / "report").write_text("x")
  if not (workdir / "runs" / "alink").is_symlink():
    (workdir / "runs" / "alink").symlink_to(pathlib.Path(JOB).name)  # A second name for JOB.
  if not (workdir / "fifo_config").exists():
    (workdir / "fifo_config").mkdir()
    os.mkfifo(workdir / "fifo_config" / "config.json")
  before = job_files(JOB)
  line = one_line_error(run_cli(["--mode=report", *args]))
  assert named in line, line
  assert job_files(JOB) == before
  assert not (workdir / "empty" / "report").exists()


def test_legend_labels_are_the_job_dirs_as_written(page, workdir, tmp_path):
  """matplotlib leaves a `_`-prefixed label out of a legend and typesets `$...$` as math
  unless told otherwise: the page's legends still show each compared job dir verbatim."""
  others = ["_b", "runs/$x$"]  # "_b train": a label matplotlib's legend would leave out.
  for other in others:
    if not (workdir / other).exists():
      shutil.copytree(OTHER, workdir / other, ignore=shutil.ignore_patterns("checkpoints"))
  report(*REPORT, f"--compare={','.join(others)}")
  svg = plot_svg(parse(workdir / JOB / "report" / "compare.html"), "loss")
  for job, color in zip([JOB, *others], ("#1f77b4", "#ff7f0e", "#2ca02c")):
    assert f">{job} train</text>" in svg, job
    assert f"stroke: {color}" in svg, (job, color)


def test_any_number_of_jobs_has_distinct_colours():
  colours = [report_plots.color(index) for index in range(100)]
  assert len(set(colours)) == len(colours), colours
  assert all(re.fullmatch("#[0-9a-f]{6}", c) for c in colours), colours
  assert colours[:3] == ["#1f77b4", "#ff7f0e", "#2ca02c"]  # matplotlib's first ones.
  jobs = [report_data.Job(epath.Path(f"/j{index}"), f"j{index}", [], [{"step": 1, "loss": 1.0}],
                          {}, {}, [], None, None, [], None, [], {}) for index in range(12)]
  curves = report_plots.curves(report_plots.QUANTITIES[0], jobs)
  assert [c.color for c in curves] == colours[:12]
