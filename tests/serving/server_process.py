"""A served model for tests, and a small HTTP client for it (urllib: a client that shares no
code with the server): `Server` is a `--mode=serve` process on a free port; `ThreadServer`
serves an already loaded model from a thread of the test's own process (the same app and
engine, so a test that has the model loaded pays no second load and compile)."""

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


class _Client:
  """Requests to `self.url`."""

  url: str

  def post(self, path, body, raw=None, timeout=120):
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
    try:
      with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
      return e.code, e.read().decode()

  def get(self, path):
    with urllib.request.urlopen(self.url + path, timeout=30) as response:
      return json.loads(response.read())

  def complete(self, body):
    status, text = self.post("/v1/completions", body)
    assert status == 200, text
    return json.loads(text)


class Server(_Client):
  """A --mode=serve process on a free port."""

  def __init__(self, workdir, *flags, job="runs/tiny"):
    self.process = subprocess.Popen(
        [sys.executable, "-m", "lingvo_lite", "--mode=serve", f"--job_log_dir={job}",
         "--port=0", *flags], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    deadline = time.time() + 240
    line = ""
    while time.time() < deadline and "serving" not in line:
      line = self.process.stdout.readline()
      if not line and self.process.poll() is not None:
        raise AssertionError(f"the server exited: {self.process.stderr.read()[-3000:]}")
    self.url = re.search(r"http://\S+", line).group(0)

  def stop(self):
    if self.process.poll() is None:
      self.process.send_signal(signal.SIGTERM)
    return self.process.communicate(timeout=120)


class ThreadServer(_Client):
  """serve's app and engine over `model` (a serving.loaded_model.LoadedModel), with uvicorn
  on a free loopback port in a thread of this process."""

  def __init__(self, model, name, max_outstanding=64, request_timeout_s=120.0):
    import uvicorn  # pylint: disable=g-import-not-at-top
    from lingvo_lite.serving import app, engine  # pylint: disable=g-import-not-at-top
    self.engine = engine.Engine(model, max_outstanding)
    self.engine.start()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    self.url = "http://127.0.0.1:%d" % listener.getsockname()[1]
    # Not the main thread: uvicorn installs no signal handlers.
    self.http = uvicorn.Server(uvicorn.Config(
        app.Server(self.engine, name, request_timeout_s).app(), log_level="warning",
        access_log=False))
    self._thread = threading.Thread(target=self.http.run, kwargs={"sockets": [listener]},
                                    daemon=True)
    self._thread.start()
    deadline = time.time() + 60
    while not self.http.started:
      assert time.time() < deadline and self._thread.is_alive(), "uvicorn did not start"
      time.sleep(0.05)

  def stop(self):
    self.http.should_exit = True
    self._thread.join(60)
    self.engine.stop(60)
