"""--mode=serve as a client sees it: a real server process, real HTTP requests.

Independent references: the same requests decoded offline by the generator in this process
(the decode program's code path, no server), and teacher forcing by a plain JAX pass over the
model's logits.
"""

import concurrent.futures
import json
import re
import shutil
import signal
import socket
import sys
import time
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite.decode.requests import Request
from lingvo_lite.serving import loaded_model
from lingvo_lite.testing import run_cli
from lingvo_lite.training.train_state import strip_boxes
from tests.serving.server_process import Server

# Small rounds (4 tokens a call) so streams come in several chunks and slots refill often.
SERVER_FLAGS = ("--fdl.decode.steps_per_call=4", "--fdl.decode.slots=4", "--max_outstanding=40")
PROMPTS = ("def main(", "import os\n", "class A:\n    def ", "x = [", "for i in range(",
           "print('", "return ", "if x == ")


@pytest.fixture(scope="module", name="servers")
def fixture_servers():
  """The module's server processes: one serves every test, until a test stops it (the
  SIGTERM test, last in the file, stops the one the others used: a server start less)."""
  started = []
  yield started
  for running in started:
    if running.process.poll() is None:
      running.stop()


@pytest.fixture
def server(servers, tiny_job):
  """The module's server, started anew only where the last one was stopped."""
  if not servers or servers[-1].process.poll() is not None:
    servers.append(Server(tiny_job, *SERVER_FLAGS))
  return servers[-1]


@pytest.fixture(scope="module")
def offline(tiny_job):
  """The same job's model in this process: the generator the decode program runs."""
  return loaded_model.from_job(str(tiny_job / "runs/tiny"),
                               assignments=["decode.steps_per_call=4", "decode.slots=4"])


def _mixed(index):
  """Request `index` of a mix: greedy, seeded sampling with top-k / top-p, stop strings,
  lengths from 3 to 40 tokens."""
  body = {"prompt": PROMPTS[index % len(PROMPTS)], "max_tokens": 3 + (index * 7) % 38}
  kind = index % 4
  if kind == 1:
    body.update(temperature=0.9, seed=index)
  elif kind == 2:
    body.update(temperature=1.2, top_k=20, top_p=0.9, seed=100 + index)
  elif kind == 3:
    body.update(stop=["\n", ")"])
  return body


def _offline_request(index, body):
  return Request(source=f"r{index}", prompt=body["prompt"], max_new_tokens=body["max_tokens"],
                 temperature=body.get("temperature"), top_k=body.get("top_k"),
                 top_p=body.get("top_p"), seed=body.get("seed"),
                 stop=tuple(body["stop"]) if "stop" in body else None)


def test_concurrent_mixed_requests_each_equal_offline_decoding(server, offline):
  bodies = [_mixed(i) for i in range(32)]
  with concurrent.futures.ThreadPoolExecutor(32) as pool:
    answers = list(pool.map(server.complete, bodies))
  expected = offline.generator.generate([_offline_request(i, b) for i, b in enumerate(bodies)])
  for body, answer, completion in zip(bodies, answers, expected):
    choice = answer["choices"][0]
    assert choice["text"] == completion.completion_text, body
    assert choice["finish_reason"] == ("length" if completion.stop_reason == "max_new_tokens"
                                       else "stop")
    assert answer["usage"]["completion_tokens"] == len(completion.completion_ids)
    assert answer["usage"]["prompt_tokens"] == len(completion.prompt_ids)
  assert server.get("/health")["outstanding"] == 0


def _stream(server, body):
  request = urllib.request.Request(server.url + "/v1/completions",
                                   data=json.dumps(dict(body, stream=True)).encode(),
                                   headers={"Content-Type": "application/json"})
  events = []
  with urllib.request.urlopen(request, timeout=120) as response:
    assert response.headers["content-type"].startswith("text/event-stream")
    for line in response:
      line = line.decode().strip()
      if line.startswith("data: "):
        events.append(line[len("data: "):])
  assert events[-1] == "[DONE]"
  return [json.loads(e) for e in events[:-1]]


def test_streaming_gives_the_tokens_of_the_whole_answer(server):
  for body in ({"prompt": "def main(", "max_tokens": 30, "n": 2, "temperature": 1.0,
                "seed": 7},
               {"prompt": "import ", "max_tokens": 25, "stop": [")"]},
               {"prompt": "x = ", "max_tokens": 20, "echo": True, "logprobs": 2}):
    whole = server.complete(body)
    chunks = _stream(server, dict(body, stream_options={"include_usage": True}))
    assert chunks[-1]["usage"] == whole["usage"]
    for choice in whole["choices"]:
      mine = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["index"] ==
              choice["index"]]
      assert "".join(c["text"] for c in mine) == choice["text"]
      assert mine[-1]["finish_reason"] == choice["finish_reason"]
      assert mine[-1]["logprobs"] == choice["logprobs"]
  # 30 tokens at 4 a round arrive in several chunks, not one at the end.
  assert len([c for c in _stream(server, {"prompt": "def ", "max_tokens": 30})
              if c["choices"]]) >= 3


def test_echo_with_logprobs_equals_teacher_forcing(server, offline):
  prompt_ids = offline.encode("def main():\n    ")
  answer = server.complete({"prompt": prompt_ids, "max_tokens": 6, "echo": True,
                            "logprobs": 5})
  logprobs = answer["choices"][0]["logprobs"]
  completion = offline.generator.generate(
      [Request(source="r", prompt_ids=tuple(prompt_ids), max_new_tokens=6)])[0]
  ids = list(prompt_ids) + list(completion.completion_ids)
  assert len(logprobs["tokens"]) == len(ids)  # The prompt's, then exactly the generated ones.
  assert logprobs["tokens"] == [offline.token_text(t) for t in ids]
  logits = jax.jit(lambda p, t: offline.setup.model.apply({"params": p}, t))(
      strip_boxes(offline.generator.params), jnp.asarray([ids], jnp.int32))
  reference = np.asarray(jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1))
  assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
  for position in range(1, len(ids)):
    row = reference[position - 1]
    assert logprobs["token_logprobs"][position] == pytest.approx(row[ids[position]], abs=2e-5)
    top = sorted(logprobs["top_logprobs"][position].values(), reverse=True)
    np.testing.assert_allclose(top, np.sort(row)[::-1][:len(top)], atol=2e-5)
  # The generated tokens' log-probabilities are those the decode recorded.
  np.testing.assert_allclose(logprobs["token_logprobs"][len(prompt_ids):],
                             completion.logprobs, atol=2e-5)


HOSTILE = [
    (b"{not json", "body", 400), (b"[1, 2]", "body", 400),
    ({"prompt": 5}, "prompt", 400), ({"prompt": []}, "prompt", 400),
    ({"prompt": [[]]}, "prompt", 400), ({"prompt": [1, -3]}, "prompt", 400),
    ({"prompt": [1, 99999]}, "prompt", 400), ({"prompt": [1, True]}, "prompt", 400),
    ({}, "prompt", 400), ({"prompt": "x", "max_tokens": -1}, "max_tokens", 400),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", 400),
    # A length refusal names what must shrink: max_tokens when the prompt alone fits.
    ({"prompt": "x", "max_tokens": 10**6}, "max_tokens", 400),
    ({"prompt": "x" * 200, "max_tokens": 1}, "prompt", 400),
    ({"prompt": "x", "temperature": "hot"}, "temperature", 400),
    ({"prompt": "x", "temperature": -1}, "temperature", 400),
    ({"prompt": "x", "top_p": 0}, "top_p", 400), ({"prompt": "x", "top_k": 1.5}, "top_k", 400),
    ({"prompt": "x", "n": 0}, "n", 400), ({"prompt": "x", "n": 1000}, "n", 400),
    ({"prompt": "x", "logprobs": 6}, "logprobs", 400),
    ({"prompt": "x", "stop": [""]}, "stop", 400), ({"prompt": "x", "stop": 3}, "stop", 400),
    ({"prompt": "x", "stop": ["a"] * 17}, "stop", 400),
    ({"prompt": "x", "top_k": 2**40}, "top_k", 400),
    ({"prompt": "\ud800"}, "prompt", 400), ({"prompt": "x", "stop": ["\udc00"]}, "stop", 400),
    ({"prompt": "x", "user": "\ud800"}, "user", 400), (b"[" * 100_000, "body", 400),
    (b'{"prompt": "\xff"}', "body", 400),
    ({"prompt": "x", "echo": "yes"}, "echo", 400), ({"prompt": "x", "seed": -1}, "seed", 400),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", 400),
    ({"prompt": "x", "suffix": "y"}, "suffix", 400), ({"prompt": "x", "best_of": 3}, "best_of",
                                                      400),
    ({"prompt": "x", "logit_bias": {"5": 1}}, "logit_bias", 400),
    ({"prompt": "x", "presence_penalty": 1}, "presence_penalty", 400),
    ({"prompt": "x", "bogus": 1}, "bogus", 400), ({"prompt": "x", "model": "gpt-4"}, "model",
                                                  404),
]


@pytest.mark.parametrize("body,field,status", HOSTILE)
def test_a_bad_request_is_refused_naming_the_field(server, body, field, status):
  raw = body if isinstance(body, bytes) else None
  code, text = server.post("/v1/completions", body, raw=raw)
  assert code == status, text
  error = json.loads(text)["error"]
  # A list's entry is named with its index: prompt[0].
  assert re.fullmatch(re.escape(field) + r"(\[\d+\])?", error["param"]), error
  assert error["param"] in error["message"], error


# Issue 38: the other routes' bodies, as the completions route's above (the fuzz of every
# route: tests/serving/test_server_fuzz.py).
OTHER_ROUTES_HOSTILE = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "\udfff", "content": "hi"}]},
     "messages[0].role"),
    ("/v1/chat/completions", b'{"messages": ' + b"[" * 100_000, "body"),
    ("/tokenize", {"prompt": "a\ud800"}, "prompt"),
    ("/tokenize", b"[" * 100_000, "body"),
    ("/detokenize", {"tokens": [5], "\ud800": 1}, "body"),
]


@pytest.mark.parametrize("route,body,field", OTHER_ROUTES_HOSTILE)
def test_other_routes_refuse_bad_bodies_naming_the_field(server, route, body, field):
  code, text = server.post(route, body, raw=body if isinstance(body, bytes) else None)
  assert code == 400, text
  error = json.loads(text)["error"]
  assert error["param"] == field and error["message"].startswith(field + ":"), error
  assert server.complete({"prompt": "x", "max_tokens": 2})["usage"]["completion_tokens"] == 2


def test_bad_requests_among_valid_ones_leave_them_untouched(server):
  valid = [{"prompt": p, "max_tokens": 12} for p in PROMPTS[:6]]
  alone = [server.complete(body)["choices"][0]["text"] for body in valid]
  mixed = valid[:3] + [b"{oops", {"prompt": "x", "top_p": 7}, {"prompt": [10**9]}] + valid[3:]
  with concurrent.futures.ThreadPoolExecutor(len(mixed)) as pool:
    answers = list(pool.map(
        lambda b: server.post("/v1/completions", b, raw=b if isinstance(b, bytes) else None),
        mixed))
  assert [code for code, _ in answers] == [200] * 3 + [400] * 3 + [200] * 3
  texts = [json.loads(text)["choices"][0]["text"] for code, text in answers if code == 200]
  assert texts == alone


def test_a_flood_past_the_queue_bound_gets_429_and_the_rest_are_served(server):
  body = {"prompt": "def ", "max_tokens": 40}
  with concurrent.futures.ThreadPoolExecutor(90) as pool:
    answers = list(pool.map(lambda _: server.post("/v1/completions", body), range(90)))
  codes = [code for code, _ in answers]
  assert set(codes) <= {200, 429} and codes.count(429) > 0 and codes.count(200) >= 40
  refused = json.loads(next(text for code, text in answers if code == 429))
  assert "--max_outstanding" in refused["error"]["message"]
  served = {json.loads(text)["choices"][0]["text"] for code, text in answers if code == 200}
  assert len(served) == 1  # Greedy: every served copy is the same answer.
  assert server.complete(body)["choices"][0]["text"] in served
  # One body asking for more than the server holds is refused before anything is tokenized.
  code, text = server.post("/v1/completions", {"prompt": ["def "] * 41, "max_tokens": 2})
  assert code == 429 and "--max_outstanding=40" in text


def test_a_client_that_leaves_mid_stream_frees_its_slot(server):
  host, port = server.url[len("http://"):].split(":")
  body = json.dumps({"prompt": "def ", "max_tokens": 60, "stream": True}).encode()
  for _ in range(3):
    with socket.create_connection((host, int(port)), timeout=30) as connection:
      connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/json\r\nContent-Length: " + str(len(body)).encode()
                         + b"\r\n\r\n" + body)
      received = b""
      while b"data: " not in received:  # The headers may come in a packet of their own.
        part = connection.recv(4096)
        assert part, received
        received += part
  deadline = time.time() + 30
  while server.get("/health")["outstanding"] and time.time() < deadline:
    time.sleep(0.2)
  assert server.get("/health")["outstanding"] == 0
  assert server.complete({"prompt": "x", "max_tokens": 5})["usage"]["completion_tokens"] == 5


def test_models_tokenizer_and_chat_refusal(server, offline):
  models = server.get("/v1/models")["data"]
  assert [m["id"] for m in models] == ["tiny"] and models[0]["weights_checksum"] == \
      offline.checksum
  info = server.get("/tokenizer_info")
  code, text = server.post("/tokenize", {"prompt": "ab" + info["eos_token"]})
  assert code == 200 and json.loads(text)["tokens"][-1] == offline.eos_id
  code, text = server.post("/detokenize", {"tokens": offline.encode("def f():")})
  assert json.loads(text)["prompt"] == "def f():"
  # This model's byte vocabulary carries no chat template: a 400 naming `messages`.
  code, text = server.post("/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "hi"}]})
  assert code == 400 and json.loads(text)["error"]["param"] == "messages"


def test_lm_eval_through_the_server_equals_the_in_process_model(server, offline, tiny_job):
  import lm_eval  # pylint: disable=g-import-not-at-top
  from lm_eval.tasks import TaskManager  # pylint: disable=g-import-not-at-top
  from lingvo_lite.harness import lm_eval_model  # pylint: disable=g-import-not-at-top

  tasks = ["lingvo_lite_pycode_choice", "lingvo_lite_pycode_next", "lingvo_lite_pycode_rolling"]
  # Our task folder only: indexing lm_eval's thousands of built-in tasks costs seconds.
  manager = TaskManager(include_path=lm_eval_model.TASK_FOLDER, include_defaults=False)
  # lm_eval's API models keep one of their max_length positions for the token they ask the
  # server to generate: local-completions at 64 scores sequences of at most 63.
  in_process = lm_eval_model.LingvoLiteLM(job_log_dir=str(tiny_job / "runs/tiny"),
                                          max_length=63)
  through_server = lm_eval.simple_evaluate(
      model="local-completions", tasks=tasks, task_manager=manager, bootstrap_iters=0,
      model_args=f"base_url={server.url}/v1/completions,model=tiny,max_length=64,"
                 "tokenizer_backend=remote,num_concurrent=8,max_retries=1")
  direct = lm_eval.simple_evaluate(model=in_process, tasks=tasks, task_manager=manager,
                                   bootstrap_iters=0)
  assert direct["config"]["weights_checksum"] == offline.checksum
  assert set(direct["config"]["task_files"]) >= {"pycode_choice.yaml", "pycode_next.jsonl"}
  for task in tasks:
    ours, theirs = direct["results"][task], through_server["results"][task]
    metrics = [k for k in ours if "," in k and "stderr" not in k]
    assert metrics
    for metric in metrics:
      assert theirs[metric] == pytest.approx(ours[metric], rel=1e-5), (task, metric)


def _flip_a_byte_of_the_largest_file(step_dir):
  files = [p for p in step_dir.rglob("*") if p.is_file()
           and p.name != "lingvo_lite_checksums.json"]
  largest = max(files, key=lambda p: p.stat().st_size)
  data = bytearray(largest.read_bytes())
  data[len(data) // 2] ^= 1
  largest.write_bytes(bytes(data))
  return largest.relative_to(step_dir)


def test_weights_that_cannot_be_read_are_one_line_and_nothing_is_left_listening(
    tiny_job, tmp_path, monkeypatch):
  """A job whose checkpoint is corrupt, served directly or as a new job's train.init_from:
  one line naming the file, exit 2; the port was not listening while the model loaded, and
  is closed (not left to the garbage collector) once the load failed."""
  job = tmp_path / "job"
  shutil.copytree(tiny_job / "runs" / "tiny", job)
  damaged = _flip_a_byte_of_the_largest_file(job / "checkpoints" / "20")
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
  seen = []  # (accepting connections while loading, the server's socket)
  real_load = loaded_model.load

  def load(*args, **kwargs):
    with socket.socket() as client:
      client.settimeout(5)
      accepting = client.connect_ex(("127.0.0.1", port)) == 0
    caller = sys._getframe(1)  # pylint: disable=protected-access
    seen.append((accepting, caller.f_locals.get("listener")))
    return real_load(*args, **kwargs)

  monkeypatch.setattr(loaded_model, "load", load)
  for args in ([f"--job_log_dir={job}"],
               ["--exp=PyCodeTiny", "--fiddler=tiny", f"--init_from={job}",
                f"--job_log_dir={tmp_path / 'new'}"]):
    result = run_cli(["--mode=serve", f"--port={port}", *args])
    assert result.code == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lingvo_lite: error: "), result.stderr
    assert f"checkpoint step 20 is corrupt: {damaged} does not match the CRC-32" in lines[0]
    accepting, listener = seen[-1]
    assert not accepting
    with socket.socket() as again:  # Free while the test still holds the server's socket.
      again.bind(("127.0.0.1", port))
      again.listen(1)
    assert listener is not None and listener.fileno() == -1
  assert len(seen) == 2 and not (tmp_path / "new").exists()


def test_sigterm_under_load_finishes_what_is_in_flight_and_exits_0(server):
  """The server the other tests used (so it runs last in the file; a test after it gets a new
  one): SIGTERM with 8 requests in flight answers all of them, then exits 0."""
  stopping = server
  # Four prompts a request, 32 in all on 4 slots: a warm server answers a one-prompt request
  # faster than 8 of them arrive, so 8 were never outstanding at once and the wait below ran
  # to its deadline (30 s) and signalled an idle server.
  body = {"prompt": ["def "] * 4, "max_tokens": 50}
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    futures = [pool.submit(stopping.post, "/v1/completions", body) for _ in range(8)]
    deadline = time.time() + 30
    while (outstanding := stopping.get("/health")["outstanding"]) < 8:
      assert time.time() < deadline, f"never 8 prompts outstanding (last {outstanding})"
      time.sleep(0.02)
    stopping.process.send_signal(signal.SIGTERM)
    answers = [f.result() for f in futures]
  stdout, stderr = stopping.process.communicate(timeout=120)
  assert stopping.process.returncode == 0, stderr[-2000:]
  assert "stopped serving tiny" in stdout
  assert [code for code, _ in answers] == [200] * 8
  for _, text in answers:
    answer = json.loads(text)
    assert answer["usage"]["completion_tokens"] == 4 * 50, answer["usage"]
    assert [c["finish_reason"] for c in answer["choices"]] == ["length"] * 4, answer
  with pytest.raises(OSError):
    stopping.get("/health")
