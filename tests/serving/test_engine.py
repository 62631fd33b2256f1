"""The serving engine: requests join the slots while others run (continuous batching), a
cancelled request frees its slot at once, the queue bound holds, and each answer equals the
generator's offline decode of the same request."""

import threading

import pytest

from lingvo_lite.decode.requests import Request
from lingvo_lite.serving import loaded_model
from lingvo_lite.serving.engine import Engine, QueueFull


@pytest.fixture(scope="module")
def model(tiny_job):
  return loaded_model.from_job(str(tiny_job / "runs/tiny"),
                               assignments=["decode.steps_per_call=2", "decode.slots=2"])


class _Answers:
  def __init__(self):
    self.done, self.errors, self.progress, self.order = {}, {}, {}, []
    self.finished = threading.Event()
    self.expected = 0

  def callbacks(self, key, on_tokens=None):
    def done(completion):
      self.done[key] = completion
      self.order.append(key)
      self._check()

    def error(message):
      self.errors[key] = message
      self._check()

    def tokens(ids):
      self.progress.setdefault(key, []).append(list(ids))
      if on_tokens:
        on_tokens(ids)
    return done, error, tokens

  def _check(self):
    if len(self.done) + len(self.errors) >= self.expected:
      self.finished.set()


def _request(i, max_new=20):
  return Request(source=f"r{i}", prompt_ids=(40 + i, 50 + i, 60), max_new_tokens=max_new,
                 temperature=0.0 if i % 2 else 0.8, seed=i)


def test_requests_join_running_slots_and_match_offline_decoding(model):
  engine = Engine(model, max_outstanding=10)
  engine.start()
  answers = _Answers()
  answers.expected = 5
  first = engine.resolve(_request(0, max_new=40))
  late = []

  def submit_late(ids):
    # While request 0 is running, four more arrive: they must start before it finishes.
    if not late and len(ids) >= 4:
      jobs = [engine.resolve(_request(i)) for i in range(1, 5)]
      late.extend(engine.submit(jobs, [answers.callbacks(i) for i in range(1, 5)]))

  engine.submit([first], [answers.callbacks(0, on_tokens=submit_late)])
  assert answers.finished.wait(120)
  engine.stop(30)
  assert not answers.errors
  # Request 1 (20 tokens) joined the free slot while request 0 (40) ran, and ended first;
  # the others took the slot it freed.
  assert answers.order.index(1) < answers.order.index(0)
  assert len(answers.progress[0]) > len(answers.progress[1])
  offline = model.generator.generate([_request(0, max_new=40)] +
                                     [_request(i) for i in range(1, 5)])
  for i, completion in enumerate(offline):
    assert answers.done[i].completion_ids == completion.completion_ids


def test_a_cancelled_request_frees_its_slot_and_reports_nothing(model):
  engine = Engine(model, max_outstanding=10)
  engine.start()
  answers = _Answers()
  answers.expected = 1
  tickets = []
  rounds_at_cancel = []

  def cancel_at_first_tokens(ids):
    if not rounds_at_cancel:
      rounds_at_cancel.append(engine.rounds)
      engine.cancel(tickets[0])

  tickets += engine.submit([engine.resolve(_request(0, max_new=60))],
                           [answers.callbacks("cancelled", on_tokens=cancel_at_first_tokens)])
  tickets += engine.submit([engine.resolve(_request(1, max_new=5))],
                           [answers.callbacks("next")])
  assert answers.finished.wait(120)
  engine.stop(30)
  assert "cancelled" not in answers.done and "cancelled" not in answers.errors
  assert len(answers.progress["cancelled"]) == 1  # No round ran it after the cancel.
  assert engine.outstanding == 0
  assert engine.rounds - rounds_at_cancel[0] < 30  # Its 60 tokens were not run out.


def test_the_queue_bound_refuses_all_or_nothing(model):
  engine = Engine(model, max_outstanding=3)
  jobs = [engine.resolve(_request(i)) for i in range(4)]
  answers = _Answers()
  with pytest.raises(QueueFull, match="at most 3"):
    engine.submit(jobs, [answers.callbacks(i) for i in range(4)])
  assert engine.outstanding == 0
  engine.submit(jobs[:3], [answers.callbacks(i) for i in range(3)])
  assert engine.outstanding == 3
  engine.stop(30)  # Never started: stopping fails what waits, with a reason.
  engine._run()  # pylint: disable=protected-access  (the thread's loop, run here to drain)
  assert set(answers.errors) == {0, 1, 2}
  assert "shutting down" in answers.errors[0]


def test_a_request_past_its_timeout_is_cancelled(model):
  import asyncio  # pylint: disable=g-import-not-at-top
  from lingvo_lite.serving import completions, openai_api  # pylint: disable=g-import-not-at-top

  engine = Engine(model, max_outstanding=4)  # Not started: nothing ever finishes.
  request = openai_api.completion_request({"prompt": [40, 41], "max_tokens": 8},
                                          model.setup.model.vocab_size)

  async def run_it():
    run = completions.CompletionRun(engine, request, "tiny", timeout_s=0.3)
    run.submit()
    assert engine.outstanding == 1

    async def connected():
      return False

    await run.whole(connected)

  with pytest.raises(completions.Timeout):
    asyncio.run(run_it())
  assert engine.outstanding == 0  # Cancelled: its slot (or place in line) is free.
