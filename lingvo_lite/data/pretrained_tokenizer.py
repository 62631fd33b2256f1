"""A pretrained model's own tokenizer: a Hugging Face folder's `tokenizer.json`, or the one a GGUF
file describes in its `tokenizer.ggml.*` metadata, run by the `tokenizers` library.

`PretrainedTokenizer(path)` is the config part a task names as its vocabulary (data/vocabulary.py
resolves it like a SentencePiece model); `read(path)` gives its `TokenizerFiles`: the tokenizer
(serialized, so a fingerprint covers everything that decides an id), BOS/EOS/UNK as the source
says, whether BOS starts a text, and the chat template.

GGUF: byte-level BPE (`tokenizer.ggml.model = gpt2`) with the pre-tokenizer that
`tokenizer.ggml.pre` names, as llama.cpp defines it (src/llama-vocab.cpp, `llm_tokenizer_bpe`):
`smollm` (SmolLM, StarCoder and others) splits off every Unicode number (`\\p{N}`) on its own,
then applies GPT-2's regex to the text between; `gpt-2` applies GPT-2's regex alone. Both are
`tokenizers` pre-tokenizers (Digits(individual_digits) then ByteLevel's GPT-2 regex). Merges are
ranked in file order. Control tokens (type 3) are special; in data they are text, not markers,
as llama.cpp tokenizes with parse_special=false.

transformers' GGUF conversion (5.23, integrations/gguf) differs for `smollm`: it knows no such
pre-tokenizer and uses GPT-2's regex alone, so a space before a digit stays with the digit's
piece (`"a  1"`: `a`, `Ġ`, `Ġ`, `1` there; `a`, `ĠĠ`, `1` in llama.cpp) and runs of whitespace
before numbers split differently. This module follows llama.cpp, whose definition SmolLM2's own
tokenizer.json (Digits then ByteLevel) shares.

Bytes per token (eval's bits per byte): a byte-level token stands for the bytes its characters
map back to (GPT-2's byte-to-character table); a SentencePiece-style token (`▁` for a space,
`<0xNN>` byte pieces) for its UTF-8; special and added tokens for none.

Longer than 300 lines with a reason: reading (a folder, a GGUF file's metadata), the bytes each
token stands for, and writing back (a folder's tokenizer files, a GGUF file's keys) are the same
format's two directions, and each direction must invert the other (tests compare round trips).
seqio sees a pretrained tokenizer through data/tokenizer_vocabulary.py.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from typing import Any, Iterable

import numpy as np

from lingvo_lite import file_writes, gguf_files, input_files, paths
from lingvo_lite.errors import UsageError

FIELD = "vocabulary"
# tokenizer.ggml.pre -> whether every Unicode number is split off first (llama.cpp's regex
# lists: `\p{N}` then GPT-2's for these; GPT-2's alone for gpt-2 and default).
_GGUF_PRE_TOKENIZERS = {"smollm": True, "starcoder": True, "refact": True, "gpt-2": False,
                        "default": False}
_CONTROL, _USER_DEFINED, _UNUSED = 3, 4, 5  # llama.cpp's token types.
# Sampling defaults: Hugging Face's generation_config.json name -> GGUF's key (as llama.cpp's
# converter maps them).
GENERATION_KEYS = {"temperature": "general.sampling.temp", "top_k": "general.sampling.top_k",
                   "top_p": "general.sampling.top_p", "min_p": "general.sampling.min_p",
                   "repetition_penalty": "general.sampling.penalty_repeat"}
# What else of a generation_config.json is a sampling default (ids come from the tokenizer).
_HF_GENERATION_ONLY = ("do_sample", "max_new_tokens", "max_length", "num_beams")


@dataclasses.dataclass(frozen=True)
class PretrainedTokenizer:
  """The tokenizer of a pretrained model, as a task's vocabulary.

  Attributes:
    path: A Hugging Face folder (its tokenizer.json, tokenizer_config.json), a tokenizer.json,
      or a .gguf file (its tokenizer.ggml.* metadata); relative to the working directory.
  """
  path: str


@dataclasses.dataclass(frozen=True)
class TokenizerFiles:
  """What a pretrained tokenizer is, read from its files.

  Attributes:
    json: The `tokenizers` Tokenizer, serialized.
    eos_id: The id that ends a document (seqio appends it).
    bos_id: The id that starts one, or None.
    unk_id: The unknown token's id, or None.
    add_bos: Whether a text's ids start with BOS.
    chat_template: The Jinja chat template, or None.
    source: Where it was read from, for messages.
    generation: The source's sampling defaults, by Hugging Face's generation_config.json
      names (`temperature`, `top_p`, ...), sorted (key, value) pairs; exports carry them
      along (decode samples as its own settings say).
    pad_id: The padding id an export names as the pad token (a task vocabulary's PAD), or
      None. Not part of the fingerprint: it decides no id of a text.
  """
  json: str
  eos_id: int
  bos_id: int | None
  unk_id: int | None
  add_bos: bool
  chat_template: str | None
  source: str
  generation: tuple[tuple[str, Any], ...] = ()
  pad_id: int | None = None

  @property
  def vocab_size(self) -> int:
    return tokenizer(self).get_vocab_size(with_added_tokens=True)

  def fingerprint(self) -> str:
    digest = hashlib.sha256(json.dumps(
        [self.json, self.eos_id, self.bos_id, self.unk_id, self.add_bos]).encode()).hexdigest()
    return f"tokenizer:{digest}"

  def encode(self, text: str | bytes) -> list[int]:
    """The ids of `text` (BOS first where the tokenizer adds it; never EOS). Special tokens'
    strings in the text are text."""
    text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
    ids = tokenizer(self).encode(text, add_special_tokens=False).ids
    return [self.bos_id, *ids] if self.add_bos and self.bos_id is not None else ids

  def decode(self, ids: Iterable[int]) -> str:
    """The text of `ids`, special tokens dropped."""
    return tokenizer(self).decode([int(i) for i in ids], skip_special_tokens=True)

  def token_byte_lengths(self) -> np.ndarray:
    """int32 [vocab_size]: the text bytes each id stands for (0 for special tokens)."""
    return _token_byte_lengths(self)


@functools.lru_cache(maxsize=8)
def tokenizer(files: TokenizerFiles) -> Any:
  """The `tokenizers.Tokenizer` of `files` (special tokens' strings encoded as text)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  made = tokenizers.Tokenizer.from_str(files.json)
  made.encode_special_tokens = True
  return made


@functools.lru_cache(maxsize=8)
def _tokenizer_reading_special_tokens(files: TokenizerFiles) -> Any:
  import tokenizers  # pylint: disable=g-import-not-at-top
  return tokenizers.Tokenizer.from_str(files.json)


def encode_with_special_tokens(files: TokenizerFiles, text: str) -> list[int]:
  """The ids of `text` with no BOS, a special token's string read as that token: what a
  server's clients expect of a tokenize call (a chat template's markers, the EOS string a
  harness stops at), unlike `encode`, which reads a data set's text as text."""
  return _tokenizer_reading_special_tokens(files).encode(text, add_special_tokens=False).ids


@functools.lru_cache(maxsize=8)
def _token_byte_lengths(files: TokenizerFiles) -> np.ndarray:
  made = tokenizer(files)
  lengths = np.zeros(made.get_vocab_size(with_added_tokens=True), np.int32)
  decoder = (input_files.json_value(files.json).get("decoder") or {})
  byte_level = _has_part(decoder, "ByteLevel")
  inverse = {c: b for b, c in _byte_to_char().items()}
  added = {token.content for token in made.get_added_tokens_decoder().values()}
  for piece, i in made.get_vocab(with_added_tokens=True).items():
    if piece in added:
      continue
    if byte_level:
      lengths[i] = sum(1 for c in piece if c in inverse)
    elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
      lengths[i] = 1
    else:
      lengths[i] = len(piece.replace("\u2581", " ").encode("utf-8"))
  return lengths


def _has_part(spec: dict, kind: str) -> bool:
  """Whether a tokenizer.json component (or a Sequence of them) includes `kind`."""
  if spec.get("type") == kind:
    return True
  return any(_has_part(part, kind) for part in spec.get("decoders", spec.get("pretokenizers",
                                                                             [])) or [])


@functools.lru_cache(maxsize=1)
def _byte_to_char() -> dict[int, str]:
  """GPT-2's table: each byte as a printable character (printable Latin-1 bytes as
  themselves, the other 68 as U+0100 onwards, in byte order)."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
               *range(ord("\xae"), ord("\xff") + 1)]
  table, shifted = {}, 0
  for byte in range(256):
    if byte in printable:
      table[byte] = chr(byte)
    else:
      table[byte] = chr(256 + shifted)
      shifted += 1
  return table


def read(spec: PretrainedTokenizer | str) -> TokenizerFiles:
  """The tokenizer `spec` names.

  Raises:
    UsageError: naming `vocabulary.path`: no such file or folder, no tokenizer in it, or a
      GGUF tokenizer of a kind not implemented here.
  """
  path = spec.path if isinstance(spec, PretrainedTokenizer) else spec
  if not isinstance(path, str) or not path.strip():
    raise UsageError(f"{FIELD}.path={path!r}: must name a Hugging Face folder, a "
                     "tokenizer.json or a .gguf file")
  return _read(os.fspath(paths.resolve(path, f"{FIELD}.path")), path)


@functools.lru_cache(maxsize=8)
def _read(resolved: str, given: str) -> TokenizerFiles:
  _refuse_special(resolved, given)
  if os.path.isdir(resolved):
    return _read_hf(os.path.join(resolved, "tokenizer.json"), given)
  if not os.path.isfile(resolved):
    raise UsageError(f"{FIELD}.path={given!r}: no such file or folder; give a Hugging Face "
                     "folder, a tokenizer.json or a .gguf file")
  with open(resolved, "rb") as f:
    magic = f.read(4)
  if magic == b"GGUF":
    return _read_gguf(resolved, given)
  return _read_hf(resolved, given)


def _read_hf(tokenizer_json: str, given: str) -> TokenizerFiles:
  import tokenizers  # pylint: disable=g-import-not-at-top
  _refuse_special(tokenizer_json, given)
  if not os.path.isfile(tokenizer_json):
    raise UsageError(f"{FIELD}.path={given!r}: has no tokenizer.json; give a Hugging Face "
                     "folder saved with its tokenizer (tokenizer.json)")
  try:
    made = tokenizers.Tokenizer.from_file(tokenizer_json)
  except Exception as e:  # pylint: disable=broad-except  # The library's parse errors.
    raise UsageError(f"{FIELD}.path={given!r}: {os.path.basename(tokenizer_json)} is not a "
                     f"tokenizers file ({str(e).splitlines()[0][:200]})") from None
  folder = os.path.dirname(tokenizer_json)
  settings = _json_object(os.path.join(folder, "tokenizer_config.json"), given)
  model = _json_object(os.path.join(folder, "config.json"), given)

  def token_id(name: str) -> int | None:
    token = settings.get(name)
    token = token.get("content") if isinstance(token, dict) else token
    found = made.token_to_id(token) if isinstance(token, str) else None
    if found is None and isinstance(model.get(f"{name}_id"), int):
      found = model[f"{name}_id"]
    return found

  eos_id = token_id("eos_token")
  if eos_id is None:
    raise UsageError(f"{FIELD}.path={given!r}: names no end-of-text token (eos_token in "
                     "tokenizer_config.json or eos_token_id in config.json)")
  template = settings.get("chat_template")
  template_file = os.path.join(folder, "chat_template.jinja")
  _refuse_special(template_file, given)
  if template is None and os.path.isfile(template_file):
    with open(template_file, encoding="utf-8") as f:
      template = f.read()
  generation = _json_object(os.path.join(folder, "generation_config.json"), given)
  return TokenizerFiles(json=made.to_str(), eos_id=eos_id, bos_id=token_id("bos_token"),
                        unk_id=token_id("unk_token"),
                        add_bos=bool(settings.get("add_bos_token", False)),
                        chat_template=template if isinstance(template, str) else None,
                        source=given,
                        generation=_generation_defaults(
                            {k: generation.get(k) for k in (*GENERATION_KEYS,
                                                            *_HF_GENERATION_ONLY)}))


def _generation_defaults(values: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
  """The numbers and flags among `values`, as `TokenizerFiles.generation` holds them."""
  return tuple(sorted((k, v) for k, v in values.items() if isinstance(v, (bool, int, float))))


def _refuse_special(path: str, given: str) -> None:
  """Refuses a tokenizer file (or the path given) that is a FIFO or a device: the reader
  would wait on it for ever (input_files)."""
  shown = f"{FIELD}.path={given!r}"
  if os.path.abspath(path) != os.path.abspath(os.path.expanduser(given)):  # A file in it.
    shown += f": {os.path.basename(path)}"
  input_files.check(path, shown, "give a Hugging Face folder, a tokenizer.json or a .gguf "
                    "file")


def _json_object(path: str, given: str) -> dict:
  _refuse_special(path, given)
  if not os.path.isfile(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      value = input_files.json_value(f.read())
  except (OSError, ValueError) as e:
    raise UsageError(f"{FIELD}.path={given!r}: {os.path.basename(path)} is not JSON "
                     f"({str(e).splitlines()[0][:200]})") from None
  if not isinstance(value, dict):
    raise UsageError(f"{FIELD}.path={given!r}: {os.path.basename(path)} is not a JSON object")
  return value


def gguf_metadata(path: str, given: str) -> dict[str, Any]:
  """The tokenizer.* and general.sampling.* metadata of a GGUF file (one-line UsageError if it
  cannot be read)."""
  try:
    reader = gguf_files.open_reader(path)
    return {name: field.contents() for name, field in reader.fields.items()
            if name.startswith(("tokenizer.", "general.sampling."))}
  except Exception as e:  # pylint: disable=broad-except  # struct, numpy, ValueError, ...
    raise UsageError(f"{FIELD}.path={given!r}: not a readable GGUF file ({type(e).__name__}: "
                     f"{(str(e).splitlines() or ['no detail'])[0][:200]}); it may be "
                     "truncated: copy it again") from None


def _gguf_bpe(meta: dict[str, Any], where: str) -> tuple[Any, list[str]]:
  """(the `tokenizers` Tokenizer a GGUF file's byte-level BPE metadata describes, its tokens
  without the padding past it)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise UsageError(f"{where}: tokenizer.ggml.model={kind!r} is not implemented; byte-level "
                     "BPE ('gpt2') is")
  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre not in _GGUF_PRE_TOKENIZERS:
    raise UsageError(f"{where}: tokenizer.ggml.pre={pre!r} is not implemented; choose from "
                     f"{', '.join(sorted(_GGUF_PRE_TOKENIZERS))}")
  tokens = meta.get("tokenizer.ggml.tokens")
  merges = meta.get("tokenizer.ggml.merges")
  if not isinstance(tokens, list) or not isinstance(merges, list):
    raise UsageError(f"{where}: has no tokenizer.ggml.tokens and merges lists")
  types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
  # Padding past the tokenizer (llama.cpp's converter lists a padded vocabulary's extra ids as
  # UNUSED `[PAD<i>]` tokens): ids the model has, the tokenizer never makes.
  while tokens and types[len(tokens) - 1] == _UNUSED:
    tokens, types = tokens[:-1], types[:-1]
  pairs = []
  for merge in merges:
    split = merge.find(" ", 1)  # As llama.cpp splits: a merge may start with a space.
    if split < 0:
      raise UsageError(f"{where}: tokenizer.ggml.merges has {merge!r}, not two tokens")
    pairs.append((merge[:split], merge[split + 1:]))
  bpe = models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=pairs,
                   fuse_unk=False, byte_fallback=False)
  made = tokenizers.Tokenizer(bpe)
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  made.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 byte_level])
                        if _GGUF_PRE_TOKENIZERS[pre] else byte_level)
  made.decoder = decoders.ByteLevel()
  made.add_tokens([tokenizers.AddedToken(token, normalized=False)
                   for token, kind_ in zip(tokens, types) if kind_ == _USER_DEFINED])
  made.add_special_tokens([tokenizers.AddedToken(token, special=True, normalized=False)
                           for token, kind_ in zip(tokens, types) if kind_ == _CONTROL])
  return made, tokens


def _read_gguf(path: str, given: str) -> TokenizerFiles:
  meta = gguf_metadata(path, given)
  where = f"{FIELD}.path={given!r}"
  made, tokens = _gguf_bpe(meta, where)

  def token_id(name: str) -> int | None:
    value = meta.get(f"tokenizer.ggml.{name}_token_id")
    if value is None:
      return None
    if not isinstance(value, int) or not 0 <= value < len(tokens):
      raise UsageError(f"{where}: tokenizer.ggml.{name}_token_id={value!r} is not a token id "
                       f"in [0, {len(tokens)})")
    return value

  eos_id = token_id("eos")
  if eos_id is None:
    raise UsageError(f"{where}: has no tokenizer.ggml.eos_token_id")
  template = meta.get("tokenizer.chat_template")
  return TokenizerFiles(json=made.to_str(), eos_id=eos_id, bos_id=token_id("bos"),
                        unk_id=token_id("unknown"),
                        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                        chat_template=template if isinstance(template, str) else None,
                        source=given,
                        generation=_generation_defaults(
                            {hf: meta.get(key) for hf, key in GENERATION_KEYS.items()}))


# What a Hugging Face folder's tokenizer is: the files `write_hf_files` writes.
HF_FILES = ("tokenizer.json", "tokenizer_config.json")


def write_hf_files(files: TokenizerFiles, folder: str, model_max_length: int) -> None:
  """Writes `files` as a Hugging Face folder's tokenizer (what `AutoTokenizer.from_pretrained`
  reads as a PreTrainedTokenizerFast): tokenizer.json, and tokenizer_config.json with the
  special tokens, whether BOS starts a text, the chat template and the context length."""
  made = tokenizer(files)
  settings: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                              "add_bos_token": files.add_bos, "add_eos_token": False,
                              "clean_up_tokenization_spaces": False,
                              "model_max_length": model_max_length}
  for name, token_id in (("bos_token", files.bos_id), ("eos_token", files.eos_id),
                         ("unk_token", files.unk_id), ("pad_token", files.pad_id)):
    if token_id is not None:
      settings[name] = made.id_to_token(token_id)
  if files.chat_template is not None:
    settings["chat_template"] = files.chat_template
  for name, text in ((HF_FILES[0], files.json),
                     (HF_FILES[1], json.dumps(settings, indent=2, ensure_ascii=False) + "\n")):
    path = os.path.join(folder, name)
    with file_writes.writing(path), open(path, "w", encoding="utf-8") as f:
      f.write(text)


def gguf_tokenizer(files: TokenizerFiles, vocab_size: int) -> dict[str, Any] | None:
  """`files` as a GGUF file's tokenizer.ggml.* metadata (what `_read_gguf` reads back), or None
  for a tokenizer GGUF cannot hold here: only a byte-level BPE whose pre-tokenizer is one
  llama.cpp names (`smollm`: Digits then ByteLevel; `gpt-2`: ByteLevel alone). A model
  vocabulary padded past the tokenizer (`vocab_size`) gets UNUSED `[PAD<i>]` tokens, as
  llama.cpp's converter writes them: llama.cpp wants a token for each row of the table."""
  spec = input_files.json_value(files.json)
  model = spec.get("model") or {}
  pre = spec.get("pre_tokenizer") or {}
  parts = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
  kinds = [(p.get("type"), p.get("individual_digits"), p.get("use_regex"),
            p.get("add_prefix_space")) for p in parts or []]
  byte_level = ("ByteLevel", None, True, False)
  if kinds == [("Digits", True, None, None), byte_level]:
    pre_name = "smollm"
  elif kinds == [byte_level]:
    pre_name = "gpt-2"
  else:
    return None
  if model.get("type") != "BPE" or not _has_part(spec.get("decoder") or {}, "ByteLevel"):
    return None
  made = tokenizer(files)
  size = made.get_vocab_size(with_added_tokens=True)
  tokens = [""] * size
  for token, index in made.get_vocab(with_added_tokens=True).items():
    tokens[index] = token
  types = [1] * size  # llama.cpp's NORMAL
  for index, added in made.get_added_tokens_decoder().items():
    types[index] = _CONTROL if added.special else _USER_DEFINED
  merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
  tokens += [f"[PAD{i}]" for i in range(size, vocab_size)]
  types += [_UNUSED] * max(vocab_size - size, 0)
  return {"pre": pre_name, "tokens": tokens, "types": types, "merges": merges}
