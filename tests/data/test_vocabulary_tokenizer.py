"""The task vocabularies lingvo_lite makes (bytes, SentencePiece unigram) as `tokenizers`
tokenizers: the same ids as seqio's / SentencePiece's on the whole stdlib validation split,
and one line for what does not convert."""

import io
import json

import numpy as np
import pytest
import sentencepiece as spm

from lingvo_lite.data import pretrained_tokenizer, vocabulary, vocabulary_tokenizer

from lingvo_lite.data.sentencepiece_training import train_sentencepiece
from lingvo_lite.data.text_vocabulary import TextVocabulary
from lingvo_lite.data.vocabulary_tokenizer import NotConvertible
from lingvo_lite.runtime import tensorflow_import
from tasks.pycode import read_documents, stdlib_dir

# Text SentencePiece must keep as text (control and byte pieces' surface forms), characters
# outside a code vocabulary (byte fallback), and whitespace runs.
AWKWARD = ["x = '</s>' + '<unk>' + '<pad>'  # <0x41>\n", "π ≈ 3.14159 🙂 日本語\n",
           "\tif x:\n\t\t    return  [ ]   \n\n\n", " leading and trailing  ", ""]


@pytest.fixture(scope="module")
def validation():
  return [d.decode("utf-8", errors="replace")
          for d in read_documents(stdlib_dir(), "validation")]


@pytest.fixture(scope="module")
def unigram(tmp_path_factory):
  """A 512-piece unigram model trained here as `SentencePieceModel` trains (every 16th train
  file), and its processor."""
  path = tmp_path_factory.mktemp("vocab") / "unigram-512.model"
  train_sentencepiece(iter(read_documents(stdlib_dir(), "train")[::16]), str(path), 512,
                      "unigram")
  return path.read_bytes(), spm.SentencePieceProcessor(model_file=str(path))


def _train(text: str, **settings) -> bytes:
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(text.splitlines()), model_writer=model,
                                 vocab_size=330, hard_vocab_limit=False, character_coverage=1.0,
                                 minloglevel=2,
                                 **settings)
  return model.getvalue()


def _compare(files, encode, decode, texts):
  """(mismatched texts, tokens, tokens that differ in equivalent segmentations): `files`' ids
  and text against the reference's.

  Ids that differ are no mismatch where the text is the same and ours score at least as high
  as the reference's within float32's resolution of its running sum: SentencePiece sums in
  float32, and among segmentations closer than that (ties like 16 + 4 spaces vs 4 + 16, and
  deep in a long document near-ties) its pick follows the rounding (vocabulary_tokenizer.py).
  """
  made = pretrained_tokenizer.tokenizer(files)
  spec = json.loads(files.json)["model"]
  scores = np.asarray([score for _, score in spec["vocab"]] if spec["type"] == "Unigram"
                      else [0.0] * files.vocab_size)
  mismatched, tokens, differing = [], 0, 0
  for number, text in enumerate(texts):
    ours, theirs = files.encode(text), encode(text)
    tokens += len(theirs)
    if files.decode(ours) != decode(theirs) or decode(theirs) != text:
      mismatched.append(f"text {number}: decodes differently")
    elif ours != theirs:
      ours_score, their_score = scores[ours].sum(), scores[theirs].sum()
      resolution = len(theirs) * np.spacing(np.float32(abs(their_score)))
      if ours_score >= their_score - resolution:
        differing += sum(a != b for a, b in zip(ours, theirs)) + abs(len(ours) - len(theirs))
        continue
      at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                min(len(ours), len(theirs)))
      mismatched.append(f"text {number}: first difference at token {at}: "
                        f"{[made.id_to_token(i) for i in ours[at:at + 4]]} vs "
                        f"{[made.id_to_token(i) for i in theirs[at:at + 4]]}, scores "
                        f"{ours_score:.6f} vs {their_score:.6f}")
  return mismatched, tokens, differing


def test_sentencepiece_unigram_ids_equal_on_the_whole_validation_split(unigram, validation):
  model, processor = unigram
  files = vocabulary_tokenizer.sentencepiece_files(model, "test model")
  mismatched, tokens, differing = _compare(files, processor.EncodeAsIds, processor.DecodeIds,
                                           validation + AWKWARD)
  print(f"{len(validation)} documents, {tokens:,} tokens, {len(mismatched)} mismatched, "
        f"{differing:,} tokens differ in equivalent segmentations")
  assert tokens > 100_000
  assert not mismatched, "\n".join(mismatched[:10])
  assert differing < 0.01 * tokens
  assert files.vocab_size == 512 and (files.eos_id, files.unk_id, files.bos_id) == (1, 2, None)
  # Literal control pieces stay text; characters outside the pieces are their UTF-8 bytes.
  assert files.eos_id not in files.encode(AWKWARD[0]), files.encode(AWKWARD[0])
  assert files.encode("🙂") == processor.EncodeAsIds("🙂")
  assert [processor.IsByte(i) for i in files.encode("🙂")] == [True] * 4


def test_a_dummy_prefix_model_converts_too():
  text = "\n".join(["def main():", "    print('hello world')", "  two  spaces  ",
                    "tags = '</s> <unk> <pad>', 0x41ABCDEF9876",
                    "up = 'a/b'  # unknown 0123456789"] * 50)
  model = _train(text, normalization_rule_name="identity", remove_extra_whitespaces=False,
                 add_dummy_prefix=True, byte_fallback=True, model_type="unigram")
  processor = spm.SentencePieceProcessor(model_proto=model)
  files = vocabulary_tokenizer.sentencepiece_files(model, "test model")
  mismatched, _, _ = _compare(files, processor.EncodeAsIds, processor.DecodeIds,
                              text.splitlines() + AWKWARD)
  assert not mismatched, "\n".join(mismatched)


def test_bytes_equal_seqio_bytes_on_the_whole_validation_split(validation):
  files = vocabulary_tokenizer.tokenizer_files(
      TextVocabulary(vocabulary.vocabulary_facts(None, "unused")))
  reference = TextVocabulary(vocabulary.vocabulary_facts(None, "unused"))
  mismatched, tokens, differing = _compare(files, reference.encode, reference.decode,
                                           validation + AWKWARD)
  assert tokens > 1_000_000 and not mismatched and not differing, mismatched[:10]
  assert (files.vocab_size, files.eos_id, files.unk_id) == (259, 1, 2)


def test_a_task_vocabulary_of_sentencepiece_converts_from_its_facts(unigram, tmp_path):
  path = tmp_path / "m.model"
  path.write_bytes(unigram[0])
  facts = vocabulary.vocabulary_facts(str(path), "unused")
  files = vocabulary_tokenizer.tokenizer_files(TextVocabulary(facts))
  assert files.encode(AWKWARD[2]) == TextVocabulary(facts).encode(AWKWARD[2])


@pytest.mark.parametrize("settings, words", [
    (dict(model_type="unigram", normalization_rule_name="identity", byte_fallback=True,
          remove_extra_whitespaces=False),
     "the character '/' of its piece '</s>' is no piece of its own"),
    (dict(model_type="bpe", normalization_rule_name="identity", byte_fallback=True),
     "is a SentencePiece BPE model (unigram models convert)"),
    (dict(model_type="unigram", byte_fallback=True), "normalizes with 'nmt_nfkc' rules"),
    (dict(model_type="unigram", normalization_rule_name="identity", byte_fallback=True),
     "removes extra whitespace"),
    (dict(model_type="unigram", normalization_rule_name="identity",
          remove_extra_whitespaces=False), "has no byte fallback"),
    (dict(model_type="unigram", normalization_rule_name="identity", byte_fallback=True,
          remove_extra_whitespaces=False, user_defined_symbols=["@@"]),
     "has USER_DEFINED pieces"),
])
def test_what_does_not_convert_says_why(settings, words):
  model = _train("\n".join(["def main():", "    return 'a b c' < 0x7"] * 50), **settings)
  with pytest.raises(NotConvertible) as error:
    vocabulary_tokenizer.sentencepiece_files(model, "the model")
  assert words in str(error.value) and "\n" not in str(error.value)


def test_seqio_vocabularies_convert_as_their_facts_do(unigram, tmp_path):
  """A task without facts gives its seqio Vocabulary (data/source.py): the same files."""
  _, seqio = tensorflow_import.import_seqio()
  path = tmp_path / "m.model"
  path.write_bytes(unigram[0])
  from_seqio = vocabulary_tokenizer.tokenizer_files(seqio.SentencePieceVocabulary(str(path)))
  facts = vocabulary.vocabulary_facts(str(path), "unused")
  assert from_seqio.json == vocabulary_tokenizer.tokenizer_files(TextVocabulary(facts)).json
  assert vocabulary_tokenizer.tokenizer_files(seqio.ByteVocabulary()).json == (
      vocabulary_tokenizer.byte_files().json)
  with pytest.raises(NotConvertible) as error:
    vocabulary_tokenizer.tokenizer_files(seqio.SentencePieceVocabulary(str(path), extra_ids=8))
  assert "the task's SentencePieceVocabulary has 8 extra ids" in str(error.value)
