"""A pretrained tokenizer's chat template: conversations rendered as its model was trained on
them, for the server's /v1/chat/completions and for chat data (tasks/formats/chat.py), and the
loss weights of a conversation's tokens.

The template is the Jinja text a tokenizer carries (`TokenizerFiles.chat_template`), rendered
in Jinja's sandbox as Hugging Face's `apply_chat_template` renders it (`trim_blocks`,
`lstrip_blocks`, `raise_exception`, the BOS and EOS strings), and the text is tokenized with
special tokens' strings read as those tokens (the template's markers are tokens).

Which tokens are the assistant's is found by rendering each conversation's prefixes, since a
template need not mark them (SmolLM2's has no `{% generation %}` markers): for each assistant
message, the conversation up to it with the generation prompt (where the assistant starts to
speak) and up to and including it (where its turn ends) must render, and tokenize, as prefixes
of the whole conversation. The tokens between the two get weight 1 up to and including the
first special token among them (the end-of-turn marker: SmolLM2's `<|im_end|>`, Llama 3's
`<|eot_id|>`); what the template writes after it (a line break) and every other token get 0. A
conversation whose prefixes do not render or tokenize as prefixes of the whole cannot be marked
so and is refused (`ConversationError`), as is one with no assistant message.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from lingvo_lite.data import pretrained_tokenizer
from lingvo_lite.data.pretrained_tokenizer import TokenizerFiles

ROLES = ("system", "user", "assistant")


class TemplateError(Exception):
  """The template failed on the messages, or refused them (its `raise_exception`)."""


class ConversationError(Exception):
  """A conversation that cannot be used, and why (one line)."""


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
  import jinja2.sandbox  # pylint: disable=g-import-not-at-top
  environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
                                                             lstrip_blocks=True)

  def raise_exception(message):
    raise TemplateError(f"the chat template refuses them: {message}")

  environment.globals["raise_exception"] = raise_exception
  try:
    return environment.from_string(template)
  except jinja2.TemplateError as e:
    raise TemplateError(f"the chat template failed on them: {e}") from None


def render(template: str, messages: Sequence[dict[str, str]], add_generation_prompt: bool,
           bos_token: str = "", eos_token: str = "") -> str:
  """`messages` through `template`; with `add_generation_prompt`, ending where the assistant
  speaks.

  Raises:
    TemplateError: the template fails on them, or refuses them.
  """
  import jinja2  # pylint: disable=g-import-not-at-top
  try:
    return _compiled(template).render(messages=list(messages),
                                      add_generation_prompt=add_generation_prompt,
                                      bos_token=bos_token, eos_token=eos_token)
  except jinja2.TemplateError as e:
    raise TemplateError(f"the chat template failed on them: {e}") from None


def special_text(files: TokenizerFiles, token_id: int | None) -> str:
  """A special token's own string ('' for None)."""
  if token_id is None:
    return ""
  return pretrained_tokenizer.tokenizer(files).decode([int(token_id)], skip_special_tokens=False)


def render_with(files: TokenizerFiles, messages: Sequence[dict[str, str]],
                add_generation_prompt: bool) -> str:
  """`render` with the tokenizer's own template and BOS/EOS strings.

  Raises:
    TemplateError: as `render`, and when the tokenizer carries no template.
  """
  if not files.chat_template:
    raise TemplateError(f"the tokenizer {files.source} carries no chat template")
  return render(files.chat_template, messages, add_generation_prompt,
                special_text(files, files.bos_id), special_text(files, files.eos_id))


def render_continuing(files: TokenizerFiles, messages: Sequence[dict[str, str]]) -> str:
  """`messages` with the last one (an assistant's answer, begun) left open: the conversation's
  text up to the end of that message's content, for a model to continue (Hugging Face's
  `continue_final_message`; lm_eval's `gen_prefix`). A template that trims the content's
  surrounding spaces is cut after the trimmed content.

  Raises:
    TemplateError: as `render_with`, or the template does not write the last message's
      content as given.
  """
  whole = render_with(files, messages, add_generation_prompt=False)
  content = messages[-1]["content"] if messages else ""
  core = content.strip()
  start = whole.rfind(core) if core else -1
  if start < 0:
    raise TemplateError("the chat template does not write the last message's content as "
                        "given, so the answer cannot be continued")
  kept = content.lstrip()  # What follows the core in the message, where the template kept it.
  end = start + (len(kept) if whole[start:start + len(kept)] == kept else len(core))
  return whole[:end]


def checked_messages(messages: Any, system: Any = None) -> list[dict[str, str]]:
  """OpenAI-style messages as a list of {"role", "content"}, a `system` string put first.

  Raises:
    ConversationError: not a list of such messages, or no assistant message.
  """
  if not isinstance(messages, list) or not messages:
    raise ConversationError("'messages' is not a non-empty list of messages")
  checked = []
  if system is not None:
    if not isinstance(system, str):
      raise ConversationError(f"'system' holds a {type(system).__name__}, not a string")
    if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system":
      raise ConversationError("has both 'system' and a first message of role 'system'")
    checked.append({"role": "system", "content": system})
  for index, message in enumerate(messages):
    if not isinstance(message, dict):
      raise ConversationError(f"message {index} is a {type(message).__name__}, not an object")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
      raise ConversationError(f"message {index} has role {role!r}; valid roles: "
                              f"{', '.join(ROLES)}")
    if not isinstance(content, str):
      raise ConversationError(f"message {index} has no string 'content'")
    checked.append({"role": role, "content": content})
  if not any(m["role"] == "assistant" for m in checked):
    raise ConversationError("has no assistant message (nothing to train on)")
  return checked


def _special_ids(files: TokenizerFiles) -> frozenset[int]:
  made = pretrained_tokenizer.tokenizer(files)
  found = {index for index, token in made.get_added_tokens_decoder().items() if token.special}
  return frozenset(found | {files.eos_id})


def conversation_tokens(files: TokenizerFiles, messages: Sequence[dict[str, str]],
                        weighted: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
  """The tokens of a whole conversation and their loss weights (see the module doc).

  Args:
    files: The tokenizer, with its chat template.
    messages: `checked_messages`' output.
    weighted: The indices of the messages whose tokens count (default: every assistant
      message's).

  Returns:
    int32 ids and float32 weights, one each per token.

  Raises:
    ConversationError: the template fails, or a prefix does not render (or tokenize) as a
      prefix of the whole.
  """
  encode = lambda text: pretrained_tokenizer.encode_with_special_tokens(files, text)
  try:
    whole = render_with(files, messages, add_generation_prompt=False)
  except TemplateError as e:
    raise ConversationError(str(e)) from None
  ids = encode(whole)
  weights = np.zeros(len(ids), np.float32)
  specials = _special_ids(files)
  if weighted is None:
    weighted = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
  for index in weighted:
    try:
      before = render_with(files, messages[:index], add_generation_prompt=True)
      through = render_with(files, messages[:index + 1], add_generation_prompt=False)
    except TemplateError as e:
      raise ConversationError(f"the conversation up to message {index}: {e}") from None
    for text, what in ((before, "before"), (through, "through")):
      if not whole.startswith(text):
        raise ConversationError(f"the chat template renders the conversation {what} message "
                                f"{index} (the assistant's) as text that is not a prefix of "
                                "the whole conversation's, so its tokens cannot be marked")
    start, end = len(encode(before)), len(encode(through))
    if ids[:start] != encode(before) or ids[:end] != encode(through):
      raise ConversationError(f"message {index} (the assistant's) shares a token with the text "
                              "around it, so the tokens of its prefix are not a prefix of the "
                              "whole conversation's")
    stop = end
    for position in range(start, end):
      if ids[position] in specials:
        stop = position + 1  # The end-of-turn marker is the assistant's to predict.
        break
    weights[start:stop] = 1.0
  return np.asarray(ids, np.int32), weights
