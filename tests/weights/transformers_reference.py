"""transformers' own load of a GGUF file, made once per machine: the test reference for a real
pretrained model.

transformers reads a GGUF file slowly (SmolLM2-135M: ~22 s on 2 cores, parsing the 49,152-token
vocabulary twice and building its tensor-name map per tensor). What it builds is saved as it
saves any model (`save_pretrained`: float32 safetensors, tokenizer.json) in the tests' cache
folder (tests/trained_jobs.cache_dir()), keyed by the file's SHA-256 and the transformers and
torch versions, and later loads read that folder (~2 s). Saving and reading float32 safetensors
is exact, so the reference is the same model transformers made from the file; the first load
of a machine (or of a new file or version) is the conversion itself.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from typing import Any

from tests import trained_jobs


def _key(path: str) -> str:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
  digest.update(f"|transformers {transformers.__version__}|torch {torch.__version__}".encode())
  return digest.hexdigest()[:24]


def load_gguf(folder: str, file: str) -> tuple[Any, Any]:
  """(tokenizer, model) as `transformers` loads `folder/file` with `gguf_file=` (float32,
  eager attention, in eval mode)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  settings = {"dtype": torch.float32, "attn_implementation": "eager"}
  cache = trained_jobs.cache_dir() / "transformers"
  saved = cache / f"{os.path.splitext(file)[0]}-{_key(os.path.join(folder, file))}"
  if saved.is_dir():
    return (transformers.AutoTokenizer.from_pretrained(str(saved)),
            transformers.AutoModelForCausalLM.from_pretrained(str(saved), **settings).eval())
  tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file)
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file,
                                                            **settings).eval()
  cache.mkdir(parents=True, exist_ok=True)
  # Written beside its place and renamed into it: a folder that exists is complete.
  staging = tempfile.mkdtemp(dir=cache, prefix=".making-")
  try:
    # transformers marks a model read from GGUF as quantized and refuses to save it, but what
    # it holds is the dequantized float32 tensors: saved as plain weights, loaded as such.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    os.rename(staging, saved)
  except OSError:  # Another process saved it first, or the disk is full: use what we made.
    shutil.rmtree(staging, ignore_errors=True)
  return tokenizer, model
