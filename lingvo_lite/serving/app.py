"""The HTTP routes of `--mode=serve`, on Starlette (an ASGI toolkit: routing, JSON and streaming
responses, nothing else; uvicorn serves it):

  POST /v1/completions         OpenAI's completions (serving/openai_api.py lists the fields)
  POST /v1/chat/completions    the same through the model's own chat template
  GET  /v1/models              the one model served
  GET  /health                 200 while the engine runs
  GET  /tokenizer_info         EOS/BOS/PAD strings, chat template, context (vLLM's shape: what
  POST /tokenize               lm_eval's `local-completions` asks to tokenize without a hub)
  POST /detokenize

Every refusal is JSON in OpenAI's error shape, naming the field: 400 for a bad field, 404 for
another model name or route, 413 for a body over the limit, 429 when the engine holds too many
requests, 504 past the request timeout. Every body goes through serving/request_body.py first
(UTF-8, JSON, nesting, text that is Unicode), so no client's bytes reach a route unchecked and
none makes a 500 (tests/serving/test_server_fuzz.py sends thousands). No request can stop the
server: whatever a handler raises becomes a 500 for that request alone.
"""

from __future__ import annotations

from typing import Any

from absl import logging
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from lingvo_lite import errors
from lingvo_lite.data import chat_template
from lingvo_lite.errors import UsageError, one_line
from lingvo_lite.serving import openai_api, request_body
from lingvo_lite.serving.completions import CompletionRun, Timeout, usage_error
from lingvo_lite.serving.engine import Engine, QueueFull
from lingvo_lite.serving.openai_api import RequestError


def _error(status: int, message: str, field: str | None,
           kind: str = "invalid_request_error") -> JSONResponse:
  # one_line: whatever a message quotes, its answer is valid UTF-8 JSON (never a 500 itself).
  return JSONResponse(openai_api.error_body(
      one_line(message), None if field is None else one_line(field), kind), status_code=status)


class Server:
  """The routes over one engine (see the module doc)."""

  def __init__(self, engine: Engine, model_name: str, request_timeout_s: float):
    self.engine = engine
    self.model = engine.model
    self.model_name = model_name
    self.request_timeout_s = request_timeout_s
    files = self.model.tokenizer_files
    self.chat_template = files.chat_template if files is not None else None

  def app(self) -> Starlette:
    routes = [
        Route("/v1/completions", self._guarded(self.completions), methods=["POST"]),
        Route("/v1/chat/completions", self._guarded(self.chat), methods=["POST"]),
        Route("/v1/models", self._guarded(self.models), methods=["GET"]),
        Route("/health", self._guarded(self.health), methods=["GET"]),
        Route("/tokenizer_info", self._guarded(self.tokenizer_info), methods=["GET"]),
        Route("/tokenize", self._guarded(self.tokenize), methods=["POST"]),
        Route("/detokenize", self._guarded(self.detokenize), methods=["POST"]),
    ]

    async def http_error(request, error: HTTPException):
      # A path of any length may be asked for (100 KB fit in a request line): no answer grows
      # with it.
      path = request.url.path
      if len(path) > errors.SHOWN_LIMIT:
        path = f"{path[:errors.SHOWN_LIMIT]}... ({len(path)} characters)"
      return _error(error.status_code, f"{request.method} {path}: {error.detail}", None,
                    "not_found" if error.status_code == 404 else "invalid_request_error")

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})

  def _guarded(self, handler):
    async def guarded(request: HttpRequest):
      try:
        return await handler(request)
      except RequestError as e:
        return _error(e.status, str(e), e.field)
      except QueueFull as e:
        return _error(429, str(e), None, "rate_limit_exceeded")
      except Timeout:
        return _error(504, f"the request ran past --request_timeout_s="
                      f"{self.request_timeout_s:g}", None, "timeout")
      except Exception as e:  # pylint: disable=broad-except
        logging.exception("request %s failed", request.url.path)
        return _error(500, f"{type(e).__name__}: {e}", None, "server_error")
    return guarded

  def _check_model(self, body: Any) -> None:
    name = body.get("model") if isinstance(body, dict) else None
    if name is not None and name != self.model_name:
      raise RequestError("model", f"{name!r} is not served here; the model is "
                         f"{self.model_name!r} (GET /v1/models)", status=404)

  # ------------------------------------------------------------------------ generation

  async def completions(self, request: HttpRequest):
    body = await request_body.read(request)
    checked = openai_api.completion_request(body, self.model.setup.model.vocab_size)
    self._check_model(body)
    return await self._run(request, CompletionRun(self.engine, checked, self.model_name,
                                                  self.request_timeout_s))

  async def chat(self, request: HttpRequest):
    body = await request_body.read(request)
    messages, checked = openai_api.chat_request(body)
    self._check_model(body)
    ids = self.model.encode(self._render(messages))
    return await self._run(request, CompletionRun(
        self.engine, checked, self.model_name, self.request_timeout_s,
        object_name="chat.completion", prompt_ids=[tuple(ids)], prompt_field="messages",
        length_field=openai_api.chat_length_field(body)))

  def _render(self, messages: list[dict[str, str]]) -> str:
    """The messages through the model's chat template, ending where the assistant speaks
    (data/chat_template.py: as chat data is rendered for training)."""
    if not self.chat_template:
      raise RequestError("messages", "this model has no chat template (its tokenizer carries "
                         "none); use /v1/completions")
    files = self.model.tokenizer_files
    special = lambda token_id: (self.model.token_text(token_id) if token_id is not None
                                else "")
    try:
      return chat_template.render(self.chat_template, messages, add_generation_prompt=True,
                                  bos_token=special(files.bos_id),
                                  eos_token=special(files.eos_id))
    except chat_template.TemplateError as e:
      raise RequestError("messages", str(e)) from None

  async def _run(self, request: HttpRequest, run: CompletionRun):
    try:
      run.submit()
    except UsageError as e:
      raise usage_error(e, run.prompt_field, run.length_field) from None
    if run.request.stream:
      return StreamingResponse(run.events(request.is_disconnected),
                               media_type="text/event-stream")
    answer = await run.whole(request.is_disconnected)
    if answer is None:  # The client left; nobody reads this.
      return _error(499, "client closed the request", None)
    return JSONResponse(answer)

  # ------------------------------------------------------------------------ the rest

  async def models(self, request: HttpRequest):
    del request
    return JSONResponse({"object": "list", "data": [{
        "id": self.model_name, "object": "model", "created": openai_api.now(),
        "owned_by": "lingvo_lite", "max_model_len": self.model.max_length,
        "weights": self.model.weights, "weights_checksum": self.model.checksum}]})

  async def health(self, request: HttpRequest):
    del request
    return JSONResponse({"status": "ok", "outstanding": self.engine.outstanding,
                         "rounds": self.engine.rounds})

  async def tokenizer_info(self, request: HttpRequest):
    del request
    if self.model.vocabulary is None:
      raise RequestError("tokenizer", "this model reads token ids; it has no text vocabulary",
                         status=404)
    name = lambda token: self.model.token_text(token) if token not in (None, -1) else None
    return JSONResponse({"eos_token": name(self.model.eos_id),
                         "bos_token": name(self.model.bos_id),
                         "pad_token": None, "chat_template": self.chat_template,
                         "model_max_length": self.model.max_length})

  async def tokenize(self, request: HttpRequest):
    body = await request_body.read(request)
    text, add_special_tokens = openai_api.tokenize_request(body)
    self._check_model(body)
    if self.model.vocabulary is None:
      raise RequestError("prompt", "this model reads token ids; it has no text vocabulary")
    ids = self.model.encode(text)
    if add_special_tokens:
      ids = self.model.with_bos(ids)
    return JSONResponse({"tokens": ids, "count": len(ids),
                         "max_model_len": self.model.max_length})

  async def detokenize(self, request: HttpRequest):
    body = await request_body.read(request)
    tokens = openai_api.detokenize_request(body, self.model.setup.model.vocab_size)
    self._check_model(body)
    return JSONResponse({"prompt": self.model.decode(tokens)})
