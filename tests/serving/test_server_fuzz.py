"""No client's bytes make the server answer 500: a fixed-seed fuzz of every route of a real
server over a real socket, and the table of issue 38's cases (text that is not Unicode in every
field, bodies nested a hundred thousand deep, length refusals naming the field that must
shrink).

The server is serve's app and engine in a thread of this process (server_process.ThreadServer)
over the tiny job's model, whose byte vocabulary is given a chat template here so the chat
route renders messages; tests/serving/test_server.py runs the same checks against a
`--mode=serve` process.
"""

import collections
import concurrent.futures
import copy
import dataclasses
import http.client
import json
import logging
import random
import socket
import threading

import pytest

from lingvo_lite.data import vocabulary_tokenizer
from lingvo_lite.errors import one_line
from lingvo_lite.serving import loaded_model, openai_api
from tests.serving.server_process import ThreadServer

SEED = 38
# Besides a body for each wrong value at each field (~1,800): random mutations, for each of
# the 4 routes that read a body; the GET routes get a sample each.
RANDOM_BODIES_PER_ROUTE = 150
CLIENTS = 4
# A template in the shape of SmolLM2's: each message between markers, an unknown role refused
# through raise_exception.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] not in ['system', 'user', "
    "'assistant'] %}{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def server(tiny_job):
  model = loaded_model.from_job(str(tiny_job / "runs/tiny"),
                                assignments=["decode.steps_per_call=4", "decode.slots=4"])
  # The same model, its byte vocabulary carrying a chat template (as a pretrained
  # tokenizer's files would): the chat route renders and tokenizes messages.
  vocabulary = copy.copy(model.vocabulary)
  vocabulary.tokenizer = dataclasses.replace(vocabulary_tokenizer.byte_files(),
                                             chat_template=CHAT_TEMPLATE)
  running = ThreadServer(dataclasses.replace(model, vocabulary=vocabulary), "tiny",
                         max_outstanding=256)
  yield running
  running.stop()


# ----------------------------------------------------------------------------- the client


class _Connection(threading.local):
  """One keep-alive connection per client thread, opened again after the server closes it."""

  def __init__(self, url):
    super().__init__()
    self.host, self.port = url[len("http://"):].split(":")
    self.connection = None

  def send(self, method, path, data):
    for attempt in range(2):
      if self.connection is None:
        self.connection = http.client.HTTPConnection(self.host, int(self.port), timeout=120)
      try:
        self.connection.request(method, path, body=data,
                                headers={"Content-Type": "application/json"})
        response = self.connection.getresponse()
        return response.status, response.read()
      except (http.client.HTTPException, ConnectionError):
        self.connection.close()
        self.connection = None
        if attempt:
          raise
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------- the bodies

# Values each field takes in a valid request (max_tokens capped small: valid bodies finish in
# a round or two).
GOOD = {
    "prompt": ["x = 1", ["a", "b("], [72, 73, 74], [[72], [73, 74]]],
    "max_tokens": [0, 1, 2, 3], "max_completion_tokens": [1, 3],
    "temperature": [0, 0.7, 1.5], "top_p": [0.5, 1], "top_k": [-1, 0, 5],
    "stop": ["\n", ["a", ")"]], "seed": [0, 7], "n": [1, 2], "stream": [True, False],
    "logprobs": [0, 2, True, False], "top_logprobs": [0, 2], "echo": [True, False],
    "user": ["me"], "presence_penalty": [0], "frequency_penalty": [0.0],
    "stream_options": [{"include_usage": True}], "best_of": [1], "suffix": [None],
    "logit_bias": [{}], "model": ["tiny"],
    "messages": [[{"role": "user", "content": "hi"}],
                 [{"role": "system", "content": "be brief", "name": "s"},
                  {"role": "user", "content": "x = "}]],
    "add_special_tokens": [True, False], "tokens": [[], [72, 73], [1, 2, 258]],
}
# Every JSON type, and the values at their edges.
WRONG = [None, True, False, 0, -1, 1, 7, 2**31, 2**63, -2**63, 10**30, 1.5, -0.0, 1e308,
         float("nan"), float("inf"), "", "x", "\ud800", "a\udfffb", "\x00", "x" * 3000,
         [], [None], [1, "a"], [[[]]], ["\ud800"], [2**70], [-1], [[1], 2], {}, {"a": 1},
         {"\ud800": 1}, {"role": "user"}, {"role": "user", "content": 5},
         {"include_usage": "\udc00"}]
ROUTES = {
    "/v1/completions": ({"prompt": "def f(", "max_tokens": 2}, openai_api.COMPLETION_FIELDS),
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 2}, openai_api.CHAT_FIELDS),
    "/tokenize": ({"prompt": "def f(", "add_special_tokens": False},
                  openai_api.TOKENIZE_FIELDS),
    "/detokenize": ({"tokens": [72, 73]}, openai_api.DETOKENIZE_FIELDS),
}
REQUIRED = {"prompt", "messages", "tokens"}
BAD_BYTES = [b"\xff", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"]


def _nested(depth, leaf="x"):
  value = leaf
  for _ in range(depth):
    value = [value]
  return value


def _valid(rng, route):
  base, fields = ROUTES[route]
  body = copy.deepcopy(base)
  settable = [f for f in fields if f in GOOD]
  for name in rng.sample(settable, rng.randint(0, min(4, len(settable)))):
    body[name] = copy.deepcopy(rng.choice(GOOD[name]))
  return body


def _wrong(rng):
  choice = rng.random()
  if choice < 0.08:
    return _nested(rng.choice([5, 33, 40]))
  return copy.deepcopy(rng.choice(WRONG))


def _every_wrong_value(rng, route):
  """A body for each wrong value at each field of `route`, and at an entry of its list fields
  (a prompt's, a message's), with valid settings picked at random beside it."""
  fields = ROUTES[route][1]
  places = [(name,) for name in fields]
  if route == "/v1/chat/completions":
    places += [("messages", 0, name) for name in ("role", "content", "name", "tool_calls")]
  else:
    places.append(("tokens" if route == "/detokenize" else "prompt", 1))
  for place in places:
    for value in WRONG + [_nested(33)]:
      body = _valid(rng, route)
      if len(place) == 1:
        body[place[0]] = copy.deepcopy(value)
      elif place[0] == "messages":
        body["messages"] = [{"role": "user", "content": "hi", place[2]: copy.deepcopy(value)}]
      else:
        body[place[0]] = [GOOD[place[0]][1][0], copy.deepcopy(value)]
      yield json.dumps(body).encode()


def _body(rng, route):
  """One fuzzed body for `route`, as bytes."""
  body = _valid(rng, route)
  kind = rng.randrange(10)
  if kind == 0:  # Valid, as far as each field goes.
    pass
  elif kind in (1, 2, 3):  # A wrong value at a field.
    body[rng.choice(ROUTES[route][1])] = _wrong(rng)
  elif kind == 4:  # A wrong value inside a list field: a prompt's entry, a message's field.
    if route == "/v1/chat/completions":
      message = body["messages"][rng.randrange(len(body["messages"]))]
      message[rng.choice(["role", "content", "name", "tool_calls"])] = _wrong(rng)
    else:
      field = "tokens" if route == "/detokenize" else "prompt"
      body[field] = [rng.choice(GOOD[field][:3]), _wrong(rng)]
  elif kind == 5:  # A field missing, another unknown.
    body.pop(rng.choice(list(body)), None)
    if rng.random() < 0.5:
      body[rng.choice(["bogus", "\ud800", "", "a" * 300])] = _wrong(rng)
  elif kind == 6:  # Not an object.
    body = _wrong(rng)
  data = json.dumps(body).encode()
  if kind == 7:  # Truncated.
    data = data[:rng.randrange(len(data))]
  elif kind == 8:  # Bytes that are not UTF-8.
    at = rng.randrange(len(data) + 1)
    data = data[:at] + rng.choice(BAD_BYTES) + data[at:]
  elif kind == 9:  # Nested past any limit, bare or inside a field.
    depth = rng.choice([40, 1000, 100_000])
    data = (b"[" * depth if rng.random() < 0.5
            else b'{"' + rng.choice(ROUTES[route][1]).encode() + b'": ' + b"[" * depth)
  return data


def _check(route, data, status, answer):
  """A 2xx, or a 4xx whose JSON names `body` (always, for a body that is not JSON in UTF-8), a
  field of the body sent or a required one (written as the server writes names: on one line, a
  lone surrogate escaped)."""
  assert 200 <= status < 300 or 400 <= status < 500, (route, data[:300], status, answer[:500])
  if status >= 400:
    error = json.loads(answer)["error"]
    field = error["param"]
    assert field and field in error["message"], (route, data[:300], error)
    try:
      sent = json.loads(data.decode("utf-8"))  # (UnicodeDecodeError is a ValueError.)
    except (ValueError, RecursionError):
      sent = None
      assert field == "body", (route, data[:300], error)
    named = {"body"} | REQUIRED | (set(sent) if isinstance(sent, dict) else set())
    root = field.split("[", 1)[0].split(".", 1)[0]
    assert root in {one_line(name) for name in named}, (route, data[:300], error)
  elif answer.startswith(b"data: "):
    assert answer.endswith(b"data: [DONE]\n\n") and b"server_error" not in answer, \
        answer[-500:]
  else:
    json.loads(answer)


def test_fuzzed_bodies_get_a_2xx_or_a_4xx_naming_a_field_and_the_server_serves_on(server):
  rng = random.Random(SEED)
  sends = [(route, "POST", data) for route in ROUTES for data in _every_wrong_value(rng, route)]
  sends += [(route, "POST", _body(rng, route)) for _ in range(RANDOM_BODIES_PER_ROUTE)
            for route in ROUTES]
  sends += [(route, "GET", _body(rng, "/v1/completions")) for _ in range(30)
            for route in ("/v1/models", "/health", "/tokenizer_info")]
  connection = _Connection(server.url)

  def send(item):
    route, method, data = item
    status, answer = connection.send(method, route, data)
    return route, data, status, answer

  with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
    answers = list(pool.map(send, sends))
  for route, data, status, answer in answers:
    _check(route, data, status, answer)
  statuses = collections.Counter(status for _, _, status, _ in answers)
  served = sum(status < 300 for route, _, status, _ in answers if route in ROUTES)
  # The mix reaches past the checks: many bodies valid enough to be served (generated,
  # tokenized), most refused.
  assert served >= 200 and statuses[400] > len(sends) // 2, statuses
  assert server.get("/health")["outstanding"] == 0
  answer = server.complete({"prompt": "def f(", "max_tokens": 4})
  assert answer["usage"]["completion_tokens"] == 4


# ----------------------------------------------------------------------------- issue 38's cases

LONG = "x" * 200  # 200 bytes: more than the tiny model's 64 positions.
CASES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a\ud800"}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "\udfff", "content": "hi"}]},
     "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "name": "\ud800"}]},
     "messages[0].name"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "tool_calls": []}]},
     "messages[0].tool_calls"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "stop": ["\ud800"]}, "stop[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "\ud800": 1},
     "body"),
    ("/tokenize", {"prompt": "\ud800"}, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/detokenize", {"tokens": [72], "model": "\udc00"}, "model"),
    ("/v1/completions", {"prompt": "x", "user": "\ud800"}, "user"),
    ("/v1/completions", {"prompt": ["x", "\ud800"]}, "prompt[1]"),
    ("/v1/completions", b"[" * 100_000, "body"),
    ("/v1/chat/completions", b'{"messages": ' + b"[" * 100_000, "body"),
    ("/tokenize", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "body"),
    ("/detokenize", b'{"tokens": ' + b"[" * 40 + b"]" * 40 + b"}", "tokens"),
    ("/v1/completions", b'{"prompt": "\xed\xa0\x80"}', "body"),  # A surrogate as UTF-8 bytes.
    # Length refusals name what must shrink: max_tokens when the prompt alone fits.
    ("/v1/completions", {"prompt": "x", "max_tokens": 1000}, "max_tokens"),
    ("/v1/completions", {"prompt": LONG, "max_tokens": 1}, "prompt"),
    ("/v1/completions", {"prompt": ["x", LONG], "max_tokens": 1}, "prompt[1]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 1000}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_completion_tokens": 1000}, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_completion_tokens": 2**40}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2**40}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}],
                              "max_tokens": 1}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "hi"}]}, "messages"),
]


@pytest.mark.parametrize("route,body,field", CASES, ids=[f"{c[0]} {c[2]}" for c in CASES])
def test_issue_38_bodies_are_refused_naming_the_field(server, route, body, field):
  code, text = server.post(route, body, raw=body if isinstance(body, bytes) else None)
  assert code == 400, text
  error = json.loads(text)["error"]
  assert error["param"] == field and error["message"].startswith(field + ":"), error


# ----------------------------------------------------------------------------- the connection

# What a client does to the HTTP exchange itself; each answer is a 4xx (or none, where the
# client is gone) and no traceback is logged: the server logs only its own failures.
CONNECTION_CASES = {
    # Fewer bytes than the Content-Length, then the client leaves: its disconnect was logged
    # as a failed request with a traceback (starlette's ClientDisconnect).
    "body cut short": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                       b"\r\n{\"prompt\"", None),
    # A path of 100 KB: its 404 echoed the whole path.
    "a long path": (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close"
                    b"\r\n\r\n", b"HTTP/1.1 404 "),
    "a method no route takes": (b"DELETE /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                b"Connection: close\r\n\r\n", b"HTTP/1.1 405 "),
}


@pytest.mark.parametrize("name", CONNECTION_CASES)
def test_a_hostile_connection_gets_a_4xx_and_logs_no_traceback(server, name, caplog):
  request, answer_start = CONNECTION_CASES[name]
  host, port = server.url[len("http://"):].split(":")
  with socket.create_connection((host, int(port)), timeout=30) as client:
    client.sendall(request)
    if answer_start is None:
      client.shutdown(socket.SHUT_WR)  # Gone before the body ended.
    answer = b""
    while chunk := client.recv(65536):
      answer += chunk
  if answer_start is not None:
    assert answer.startswith(answer_start), answer[:300]
    assert len(answer) < 2000, answer[:300]  # Nothing of the request echoed whole.
  assert server.complete({"prompt": "def f(", "max_tokens": 2})["usage"]["completion_tokens"]
  failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
  assert not failures, failures[0].getMessage()
