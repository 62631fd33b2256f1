"""The GPT-J, Llama and GPT-2 model configs as functions of their fields.

Each family is a class of its own (lingvo_lite/models/gptj.py, llama.py, gpt2.py) whose
defaults are its structural choices; experiments configure it directly,
`fdl.Config(GptJ, vocab_size=..., num_layers=...)`. These functions are the same configs for
code written against this module.
"""

import fiddle as fdl

from lingvo_lite.models.gpt2 import Gpt2
from lingvo_lite.models.gptj import GptJ
from lingvo_lite.models.llama import Llama


def gptj(**fields) -> fdl.Config[GptJ]:
  """GPT-J (mesh-transformer-jax) with these fields."""
  return fdl.Config(GptJ, **fields)


def llama(**fields) -> fdl.Config[Llama]:
  """Llama with these fields."""
  return fdl.Config(Llama, **fields)


def gpt2(**fields) -> fdl.Config[Gpt2]:
  """GPT-2 with these fields."""
  return fdl.Config(Gpt2, **fields)
