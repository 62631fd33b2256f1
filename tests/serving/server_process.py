"""A `--mode=serve` process on a free port, and a small HTTP client for it (urllib: a client
that shares no code with the server)."""

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request


class Server:
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

  def stop(self):
    if self.process.poll() is None:
      self.process.send_signal(signal.SIGTERM)
    return self.process.communicate(timeout=120)
