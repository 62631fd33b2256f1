"""The run report in a real browser: headless Chromium opens JOB/report/index.html from disk,
and what it rendered is read back over the DevTools protocol (`--remote-debugging-pipe`: JSON
messages ended by NUL on file descriptors 3 and 4, no extra package).

Asserted from the rendered page: every plot image decoded (a non-zero natural size), the final
train loss shown is the last row of metrics.jsonl, and the page asked for nothing from the
network; a screenshot of it is saved to the test's output folder (Bazel's
TEST_UNDECLARED_OUTPUTS_DIR, else the test's tmp_path) and must not be blank.

The job is written here, not trained: a config.json written by lingvo_lite's own writer, and
metric rows long enough (2,500 train rows) that the report thins its curves (to 2,000
points).
"""

import base64
import fcntl
import io
import json
import math
import os
import pathlib
import select
import subprocess
import time

import pytest

from lingvo_lite import testing
from lingvo_lite.config import files as config_files, registry
from lingvo_lite.experiment import with_default_parts
from lingvo_lite.testing import run_cli

CHROMIUM = "/usr/bin/chromium"
TIMEOUT_S = 60
WIDTH, HEIGHT = 1280, 2000
# The closed network and a root user: no sandbox, no background fetches, a fresh profile.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe")
STEPS = 2500

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"{CHROMIUM} is not installed (bin/setup.sh installs "
                                       "Debian's chromium)")


def _above_4(fd: int) -> int:
  """`fd` moved to a number above 4, so that the child's redirections to 3 and 4 cannot
  overwrite or close it."""
  moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
  os.close(fd)
  return moved


class DevTools:
  """A Chromium process driven over the DevTools pipe."""

  def __init__(self, profile: pathlib.Path):
    # The browser reads commands on fd 3 and writes answers and events on fd 4.
    # bash moves the pipes there: a preexec_fn would run Python in the forked child of
    # this multi-threaded process (JAX's threads), which can deadlock.
    commands_read, self._commands = (_above_4(fd) for fd in os.pipe())
    self._answers, answers_write = (_above_4(fd) for fd in os.pipe())
    self.process = subprocess.Popen(
        ["/bin/bash", "-c", f'exec "$0" "$@" 3<&{commands_read} 4>&{answers_write} '
         f"{commands_read}<&- {answers_write}>&-", CHROMIUM, *FLAGS,
         f"--user-data-dir={profile}", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        pass_fds=(commands_read, answers_write))
    os.close(commands_read)
    os.close(answers_write)
    self._buffer = b""
    self._next_id = 0
    self.events: list[dict] = []

  def _message(self, deadline: float) -> dict:
    while b"\0" not in self._buffer:
      left = deadline - time.monotonic()
      ready, _, _ = select.select([self._answers], [], [], max(left, 0))
      if not ready:
        raise TimeoutError("Chromium did not answer over DevTools")
      chunk = os.read(self._answers, 1 << 20)
      if not chunk:
        raise RuntimeError(f"Chromium closed the DevTools pipe (exit {self.process.poll()})")
      self._buffer += chunk
    message, _, self._buffer = self._buffer.partition(b"\0")
    return json.loads(message)

  def call(self, method: str, session: str | None = None, **params) -> dict:
    self._next_id += 1
    message = {"id": self._next_id, "method": method, "params": params}
    if session:
      message["sessionId"] = session
    os.write(self._commands, json.dumps(message).encode() + b"\0")
    deadline = time.monotonic() + TIMEOUT_S
    while True:
      answer = self._message(deadline)
      if answer.get("id") == self._next_id:
        assert "error" not in answer, (method, answer["error"])
        return answer["result"]
      self.events.append(answer)

  def evaluate(self, session: str, expression: str):
    result = self.call("Runtime.evaluate", session, expression=expression, returnByValue=True,
                       awaitPromise=True)
    assert "exceptionDetails" not in result, result["exceptionDetails"]
    return result["result"].get("value")

  def close(self) -> None:
    try:
      if self.process.poll() is None:
        self.call("Browser.close")
    except (OSError, RuntimeError, TimeoutError, AssertionError):
      pass
    finally:
      try:
        self.process.wait(timeout=20)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait(timeout=20)
      os.close(self._commands)
      os.close(self._answers)


def write_job(job: pathlib.Path, experiment_name: str = "PyCodeTiny", experts: int = 0) -> None:
  """A job dir as training leaves it, as far as the report reads it (no checkpoints); with
  `experts`, a mixture of experts' rows (each expert's share of the choices, drifting from
  unbalanced to balanced)."""
  experiment = registry.lookup(experiment_name)
  config_files.write(job, with_default_parts(testing.tiny_config(experiment_name,
                                                                 f"train.steps={STEPS}")),
                     experiment)
  with open(job / "metrics.jsonl", "w") as f:
    for step in range(1, STEPS + 1):
      row = {
          "step": step, "loss": 5.5 * math.exp(-step / 400) + 1.0 + 0.05 * math.sin(step),
          "learning_rate": 3e-3 * min(step / 50, 1.0), "grad_norm": 1.0 + 2.0 / step,
          "tokens_per_s": 20000.0 + 500 * math.cos(step), "mfu": 0.2,
          "data_wait_s": 0.001}
      weights = [math.exp(-(e + 1) * math.exp(-step / 500)) for e in range(experts)]
      row.update({f"expert_fraction/{e:03d}": w / sum(weights) for e, w in enumerate(weights)})
      f.write(json.dumps(row) + "\n")
  with open(job / "eval_validation.jsonl", "w") as f:
    for step in range(100, STEPS + 1, 100):
      f.write(json.dumps({"step": step, "loss": 5.0 * math.exp(-step / 400) + 1.1,
                          "bits_per_byte": 2.0 * math.exp(-step / 400) + 1.5,
                          "accuracy": 0.3}) + "\n")


def output_folder(tmp_path: pathlib.Path) -> pathlib.Path:
  return pathlib.Path(os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or tmp_path)


@pytest.mark.parametrize("experiment, experts, plots", [
    ("PyCodeTiny", 0, 7),  # Loss, bits/byte, lr, grad norm, tok/s, MFU, wait.
    ("PyCodeMixtralTiny", 8, 8)])  # And the experts' token shares.
def test_the_report_renders_in_chromium(tmp_path, monkeypatch, experiment, experts, plots):
  monkeypatch.chdir(tmp_path)
  write_job(tmp_path / "runs" / "shown", experiment, experts)
  result = run_cli(["--mode=report", "--job_log_dir=runs/shown"])
  assert result.code == 0, result.stderr[-3000:]
  page = tmp_path / "runs" / "shown" / "report" / "index.html"
  last = json.loads((tmp_path / "runs" / "shown" / "metrics.jsonl").read_text()
                    .splitlines()[-1])

  browser = DevTools(tmp_path / "profile")
  try:
    target = browser.call("Target.createTarget", url="about:blank")["targetId"]
    session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    browser.call("Network.enable", session)
    browser.call("Emulation.setDeviceMetricsOverride", session, width=WIDTH, height=HEIGHT,
                 deviceScaleFactor=1, mobile=False)
    browser.call("Page.navigate", session, url=page.as_uri())
    deadline = time.monotonic() + TIMEOUT_S
    while browser.evaluate(session, "document.readyState") != "complete":
      assert time.monotonic() < deadline, "the page did not finish loading"
      time.sleep(0.05)
    # Every image decoded: decode() rejects for one that cannot be.
    rendered = browser.evaluate(session, """
        Promise.all([...document.images].map(i => i.decode().then(() => 'ok', e => String(e))))
          .then(decoded => JSON.stringify({
            decoded,
            sizes: [...document.images].map(i => [i.naturalWidth, i.naturalHeight]),
            loss: document.getElementById('final-train-loss').textContent,
            exact: document.getElementById('final-train-loss').dataset.value,
            changed: document.querySelectorAll('tr.changed').length,
            quantities: [...document.querySelectorAll('figure')].map(
                f => f.dataset.quantity)}))""")
    shot = base64.b64decode(browser.call("Page.captureScreenshot", session,
                                         format="png")["data"])
  finally:
    browser.close()
  rendered = json.loads(rendered)

  assert len(rendered["sizes"]) == plots, rendered
  assert rendered["decoded"] == ["ok"] * plots, rendered["decoded"]
  assert ("expert_fraction" in rendered["quantities"]) == bool(experts), rendered["quantities"]
  assert all(width > 0 and height > 0 for width, height in rendered["sizes"]), rendered
  assert rendered["loss"] == f"{last['loss']:.4f}"
  assert float(rendered["exact"]) == last["loss"]
  assert rendered["changed"] > 0
  # Nothing but the page itself was requested (its images are data: URIs).
  requested = [e["params"]["request"]["url"] for e in browser.events
               if e.get("method") == "Network.requestWillBeSent"]
  assert requested and all(url == page.as_uri() or url.startswith("data:")
                           for url in requested), requested

  screenshot = output_folder(tmp_path) / f"report-{experiment}.png"
  screenshot.write_bytes(shot)
  from PIL import Image  # pylint: disable=g-import-not-at-top
  with Image.open(io.BytesIO(shot)) as image:
    assert image.size == (WIDTH, HEIGHT)
    colors = image.convert("RGB").getcolors(maxcolors=1 << 16)
    # A blank page is one colour; the report has text, tables and plots in several.
    assert colors is None or len(colors) > 50, f"{len(colors)} colours"
