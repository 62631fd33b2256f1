"""Progress of long work (`lingvo_lite.runtime.progress`): plain lines in a log, a bar on a terminal,
nothing for quick work; and an eval pass that reports through it."""

import io

import jax
import numpy as np
import pytest

from lingvo_lite.data.synthetic import SyntheticData
from lingvo_lite.on_mesh import evaluation
from lingvo_lite.runtime import progress
from lingvo_lite.training.objectives.lm import LanguageModelling


class _Clock:
  """Seconds that pass only when a test says so."""

  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


class _Terminal(io.StringIO):
  def isatty(self):
    return True


@pytest.fixture(autouse=True)
def _default_interval(monkeypatch):
  monkeypatch.delenv(progress.INTERVAL_ENV, raising=False)


def _run(bar, clock, updates, seconds_each, **update_args):
  with bar:
    for _ in range(updates):
      clock.now += seconds_each
      bar.update(**update_args)


def test_a_log_gets_a_line_every_interval_with_counts_and_eta_and_one_at_the_end():
  clock, log = _Clock(), io.StringIO()
  bar = progress.Progress("eval validation", total=400, unit="batches", stream=log,
                          clock=clock, interval=30)
  _run(bar, clock, 400, 0.25)  # 100 s in all.
  assert log.getvalue().splitlines() == [
      "eval validation: 120/400 batches (30%), 30.0 s, ETA 1m10s",
      "eval validation: 240/400 batches (60%), 1m00s, ETA 40.0 s",
      "eval validation: 360/400 batches (90%), 1m30s, ETA 10.0 s",
      "eval validation: 400/400 batches (100%), 1m40s"]


def test_quick_work_shows_nothing_in_a_log_or_on_a_terminal():
  for stream in (io.StringIO(), _Terminal()):
    clock = _Clock()
    # Shorter than the delay: not even a terminal's bar.
    _run(progress.Progress("eval", total=10, stream=stream, clock=clock), clock, 10, 0.2)
    assert stream.getvalue() == ""
  clock, log = _Clock(), io.StringIO()
  # Past the delay but shorter than the interval: a log gets no line.
  _run(progress.Progress("eval", total=10, stream=log, clock=clock), clock, 10, 2.0)
  assert log.getvalue() == ""


def test_a_terminal_gets_a_bar_redrawn_in_place_and_erased_at_the_end(monkeypatch):
  monkeypatch.setenv("COLUMNS", "120")
  clock, terminal = _Clock(), _Terminal()
  bar = progress.Progress("building pycode/train", total=8, unit="shards", stream=terminal,
                          clock=clock)
  _run(bar, clock, 8, 1.0)
  out = terminal.getvalue()
  assert "\n" not in out
  draws = out.split("\r")[1:]
  # From the delay (3 s) on, one redraw per update; then the line is erased.
  assert draws[0] == "building pycode/train: [#######.............] 3/8 shards (38%), 3.0 s, " \
                     "ETA 5.0 s\x1b[K"
  assert draws[-2] == "building pycode/train: [####################] 8/8 shards (100%), " \
                      "8.0 s\x1b[K"
  assert draws[-1] == "\x1b[K" and len(draws) == 7
  # A narrower terminal gets the line cut to its width: a wrapped line would not redraw.
  monkeypatch.setenv("COLUMNS", "40")
  clock, terminal = _Clock(), _Terminal()
  _run(progress.Progress("building pycode/train", total=8, stream=terminal, clock=clock),
       clock, 8, 1.0)
  assert terminal.getvalue().split("\r")[1] == "building pycode/train: [#######........\x1b[K"


def test_a_terminal_is_not_redrawn_faster_than_it_can_be_read():
  clock, terminal = _Clock(), _Terminal()
  bar = progress.Progress("eval", total=1000, stream=terminal, clock=clock)
  clock.now += 5
  _run(bar, clock, 999, 0.001)  # 999 updates within one second.
  assert 9 <= terminal.getvalue().count("\r") <= 12  # Every REDRAW_S (0.1 s), and the erase.


def test_an_interval_of_zero_writes_a_line_per_update_with_its_detail():
  clock, log = _Clock(), io.StringIO()
  bar = progress.Progress("max batch search (full)", unit="compiles", stream=log, clock=clock,
                          interval=0)
  with bar:
    for seconds, batch in ((2.0, 2), (1.5, 8), (5.0, 24)):
      clock.now += seconds
      bar.update(1, f"per-device batch {batch}: fits")
  # The first compile ended within the delay: no line for it.
  assert log.getvalue().splitlines() == [
      "max batch search (full): 2 compiles, 3.5 s; per-device batch 8: fits",
      "max batch search (full): 3 compiles, 8.5 s; per-device batch 24: fits"]
  clock, log = _Clock(), io.StringIO()
  with progress.Progress("search", unit="compiles", stream=log, clock=clock, interval=0) as bar:
    clock.now += 4.0
    bar.update(1, "per-device batch 1: fits")
  assert log.getvalue() == "search: 1 compile, 4.0 s; per-device batch 1: fits\n"


def test_other_processes_of_a_multi_process_run_show_nothing(monkeypatch):
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(distributed.global_state, "process_id", 1)
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  clock, log = _Clock(), io.StringIO()
  _run(progress.Progress("eval", total=3, stream=log, clock=clock, interval=0), clock, 3, 5.0)
  assert log.getvalue() == ""


class _SummingSteps:
  """The eval step's sums for a batch, without a model: every token right, 1 nat each."""

  # One process reads the whole batch (JittedSteps.data_block: its block index, the blocks).
  data_block = (0, 1)

  def global_batch(self, local):
    return local

  def scorer(self, source):
    del source
    return LanguageModelling()

  def eval_step(self, objective, per_token=False):
    del objective, per_token

    def sums(params, batch, frozen=None):
      del params, frozen
      weight = float(np.sum(batch["weights"]))
      return {"cross_entropy_sum": weight, "weight_sum": weight, "correct_sum": weight}
    return sums


def test_an_eval_pass_reports_each_batch_when_the_environment_asks(monkeypatch, capsys):
  monkeypatch.setenv(progress.INTERVAL_ENV, "0")
  source = SyntheticData(vocab_size=16, sequence_length=4, global_batch_size=2, num_batches=3)
  metrics = evaluation.evaluate_set(_SummingSteps(), None, source, "validation")
  assert metrics["tokens"] == 24 and metrics["loss"] == 1.0
  lines = capsys.readouterr().err.splitlines()
  assert [line.split(", ")[0] for line in lines] == [
      "eval validation: 1/3 batches (33%)", "eval validation: 2/3 batches (67%)",
      "eval validation: 3/3 batches (100%)"]
  assert "ETA" in lines[0] and "ETA" not in lines[2]


def test_an_unreadable_interval_setting_keeps_the_default(monkeypatch):
  monkeypatch.setenv(progress.INTERVAL_ENV, "soon")
  assert progress.default_interval() == progress.INTERVAL_S
  monkeypatch.setenv(progress.INTERVAL_ENV, "2.5")
  assert progress.default_interval() == 2.5


def test_a_stream_that_cannot_be_written_ends_the_showing_not_the_work():
  clock, closed = _Clock(), io.StringIO()
  closed.close()  # As a pipe whose reader went away.
  bar = progress.Progress("eval", total=3, stream=closed, clock=clock, interval=0)
  _run(bar, clock, 3, 5.0)  # No exception.
  assert bar.line(clock.now) == "eval: 3/3 items (100%), 15.0 s"
