"""Small tokenizers with chat templates, written as Hugging Face folders for tests: a byte-level
BPE with no merges (every byte one token) plus a template's special tokens, so a tiny model's
vocabulary (320) covers it.

Two templates: ChatML as SmolLM2's tokenizer carries it (`<|im_start|>role\\n...<|im_end|>\\n`,
with a default system message), and Llama 3's (`<|start_header_id|>role<|end_header_id|>\\n\\n
...<|eot_id|>`, BOS first, contents trimmed), as Meta's Llama-3-8B-Instruct tokenizer_config.json
writes it.
"""

from __future__ import annotations

import json
import os

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

TEMPLATES = {
    "chatml": (SMOLLM2_TEMPLATE, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
               "<|im_end|>", None),
    "llama3": (LLAMA3_TEMPLATE, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                 "<|end_header_id|>", "<|eot_id|>"],
               "<|eot_id|>", "<|begin_of_text|>"),
}


def byte_level_folder(folder: str | os.PathLike, template: str = "chatml") -> str:
  """Writes a byte-level tokenizer with `template`'s chat template and special tokens into
  `folder` (tokenizer.json, tokenizer_config.json); returns the folder."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  from lingvo_lite.data.pretrained_tokenizer import _byte_to_char  # pylint: disable=g-import-not-at-top
  text, specials, eos, bos = TEMPLATES[template]
  chars = [_byte_to_char()[byte] for byte in range(256)]
  made = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
  made.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  made.decoder = decoders.ByteLevel()
  made.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                           for t in specials])
  os.makedirs(folder, exist_ok=True)
  made.save(os.path.join(folder, "tokenizer.json"))
  settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos,
              "chat_template": text, "add_bos_token": False}
  if bos is not None:
    settings["bos_token"] = bos
  with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
    json.dump(settings, f)
  return os.fspath(folder)
