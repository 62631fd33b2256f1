"""Local-file seqio Tasks: documents read back per shard, names, and every bad-input report."""

import json
import os
import re

import numpy as np
import pytest

from lingvo_lite.data import vocabulary as vocab_lib
from lingvo_lite.runtime.tensorflow_import import import_tensorflow
from lingvo_lite.errors import DataError, UsageError
from tasks import local_files
from tasks.formats import jsonl, parquet, prompt_completion, text as text_format, tfrecord

tf = import_tensorflow()
import seqio  # pylint: disable=g-import-not-at-top,wrong-import-position

BYTES = 259


def _implemented(function, *args) -> bool:
  try:
    function(*args)
  except NotImplementedError:
    return False
  except Exception:  # pylint: disable=broad-except
    return True
  return True


@pytest.fixture(autouse=True)
def _vocabulary_stand_in(monkeypatch):
  """Bytes and .model files as lingvo_lite.data.vocabulary will resolve them, until it does."""
  if not _implemented(vocab_lib.vocabulary_size, None):
    def size(vocabulary):
      if isinstance(vocabulary, vocab_lib.SentencePieceModel):
        return vocabulary.vocab_size
      return BYTES if vocabulary is None else seqio.SentencePieceVocabulary(vocabulary).vocab_size
    monkeypatch.setattr(vocab_lib, "vocabulary_size", size)
  if not _implemented(vocab_lib.resolve_vocabulary, None, "t", list):
    def resolve(vocabulary, task_name, train_texts):
      del task_name, train_texts
      return seqio.ByteVocabulary() if vocabulary is None else seqio.SentencePieceVocabulary(
          vocabulary)
    monkeypatch.setattr(vocab_lib, "resolve_vocabulary", resolve)


def _write(path, content):
  path.parent.mkdir(parents=True, exist_ok=True)
  if isinstance(content, bytes):
    path.write_bytes(content)
  else:
    path.write_text(content, encoding="utf-8")
  return str(path)


def _jsonl(path, records):
  return _write(path, "".join(json.dumps(r) + "\n" for r in records))


def _ids(text):
  return [b + 3 for b in text.encode()] + [1]


def _read(task, split="train", index=None):
  """The documents of `split` (or of its shard `index`) through the store builder's path."""
  shards = task.source.list_shards(split)
  info = None if index is None else seqio.ShardInfo(index=index, num_shards=len(shards))
  dataset = task.source.get_dataset(split=split, shuffle=False, shard_info=info)
  dataset = task.preprocess_postcache(task.preprocess_precache(dataset), sequence_length=None)
  return list(dataset.as_numpy_iterator())


def _targets(task, split="train", index=None):
  examples = _read(task, split, index)
  for example in examples:
    assert example["targets"].dtype == np.int32
  return [example["targets"].tolist() for example in examples]


def _data_error(task, split="train") -> str:
  with pytest.raises(Exception) as caught:  # pylint: disable=broad-except
    _read(task, split)
  error = local_files.data_error_from(caught.value)
  assert isinstance(error, DataError), caught.value
  return str(error)


def test_text_files_are_one_document_each_and_one_shard_each(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # Relative patterns resolve against the folder at construction.
  _write(tmp_path / "data" / "b.txt", "héllo\n")
  _write(tmp_path / "data" / "a.txt", "x = 1\ny = 2\n")
  _write(tmp_path / "data" / "c.md", "not matched")
  _write(tmp_path / "eval.txt", "eval")
  task = text_format.text_files_task({"train": "data/*.txt", "validation": ["eval.txt"]})
  monkeypatch.chdir("/")
  assert task.splits == ("train", "validation") and task.vocab_size == BYTES
  assert re.fullmatch(r"local_text_file_[0-9a-f]{10}", task.name)
  shards = task.source.list_shards("train")
  assert shards == [str(tmp_path / "data" / "a.txt"), str(tmp_path / "data" / "b.txt")]
  assert _targets(task, "train", 0) == [_ids("x = 1\ny = 2\n")]
  assert _targets(task, "train", 1) == [_ids("héllo\n")]
  assert _targets(task) == [_ids("x = 1\ny = 2\n"), _ids("héllo\n")]
  assert _targets(task, "validation") == [_ids("eval")]
  assert set(_read(task)[0]) == {"targets"}
  raw = list(task.source.get_dataset(split="train", shuffle=False).as_numpy_iterator())
  assert raw == [{"text": b"x = 1\ny = 2\n"}, {"text": "héllo\n".encode()}]


def test_text_lines_skip_blank_lines_and_drop_line_breaks(tmp_path):
  _write(tmp_path / "a.txt", b"one\r\n\n   \ntwo\nthree")
  _write(tmp_path / "b.txt", b"four\n")
  task = text_format.text_files_task({"train": str(tmp_path / "*.txt")}, unit="line")
  assert _targets(task, index=0) == [_ids("one"), _ids("two"), _ids("three")]
  assert _targets(task, index=1) == [_ids("four")]


def test_json_lines_read_the_text_field(tmp_path):
  _jsonl(tmp_path / "a.jsonl", [{"body": "first", "id": 1}, {"body": "", "id": 2},
                                {"body": "second", "id": 3}])
  _jsonl(tmp_path / "b.jsonl", [{"body": "third"}])
  task = jsonl.json_lines_task({"train": str(tmp_path / "*.jsonl")}, text_field="body")
  assert _targets(task, index=0) == [_ids("first"), _ids("second")]  # The empty one: skipped.
  assert _targets(task, index=1) == [_ids("third")]


def test_prompt_completion_weights_count_only_the_completion(tmp_path):
  _jsonl(tmp_path / "ft.jsonl", [{"q": "2+2=", "a": "4"}, {"q": "", "a": "hi"}])
  task = prompt_completion.prompt_completion_task({"train": str(tmp_path / "ft.jsonl")},
                                            prompt_field="q", completion_field="a")
  examples = _read(task)
  assert [e["targets"].tolist() for e in examples] == [_ids("2+2=4"), _ids("hi")]
  assert examples[0]["weights"].dtype == np.float32
  assert examples[0]["weights"].tolist() == [0, 0, 0, 0, 1, 1]
  assert examples[1]["weights"].tolist() == [1, 1, 1]
  raw = next(task.source.get_dataset(split="train", shuffle=False).as_numpy_iterator())
  assert raw["text"] == b"2+2=4"


def test_parquet_reads_the_text_column_and_skips_nulls(tmp_path):
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  pq.write_table(pa.table({"content": ["alpha", None, "beta"], "n": [1, 2, 3]}),
                 tmp_path / "p0.parquet", row_group_size=2)
  pq.write_table(pa.table({"content": ["gamma"], "n": [4]}), tmp_path / "p1.parquet")
  task = parquet.parquet_task({"train": str(tmp_path / "*.parquet")},
                                  text_column="content")
  assert _targets(task, index=0) == [_ids("alpha"), _ids("beta")]
  assert _targets(task, index=1) == [_ids("gamma")]


def _token_file(path, documents, feature="text"):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for ids in documents:
      example = tf.train.Example(features=tf.train.Features(feature={
          feature: tf.train.Feature(int64_list=tf.train.Int64List(value=ids))}))
      writer.write(example.SerializeToString())
  return str(path)


def test_pretokenized_tfrecords_keep_their_ids_without_eos(tmp_path):
  _token_file(tmp_path / "a.tfrecords", [[5, 6, 50256], [7, 50256]])
  _token_file(tmp_path / "b.tfrecords", [[9, 50399]])
  task = tfrecord.pretokenized_tfrecord_task({"train": str(tmp_path / "*.tfrecords")},
                                                vocab_size=50400)
  assert task.vocab_size == 50400
  assert _targets(task, index=0) == [[5, 6, 50256], [7, 50256]]
  assert _targets(task, index=1) == [[9, 50399]]
  vocabulary = task.output_features["targets"].vocabulary
  assert isinstance(vocabulary, seqio.PassThroughVocabulary) and vocabulary.vocab_size == 50400


def test_a_sentencepiece_model_file_tokenizes(tmp_path):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  text = "the cat sat on the mat\nthe dog sat on the log\n" * 20
  _write(tmp_path / "corpus.txt", text)
  spm.SentencePieceTrainer.train(
      input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "sp"), vocab_size=30,
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, minloglevel=2)
  model = str(tmp_path / "sp.model")
  task = text_format.text_files_task({"train": str(tmp_path / "corpus.txt")}, vocabulary=model)
  expected = spm.SentencePieceProcessor(model_file=model).encode(text) + [1]
  assert _targets(task) == [expected]


def test_a_trained_vocabulary_learns_from_the_train_split(tmp_path, monkeypatch):
  _jsonl(tmp_path / "train.jsonl", [{"p": "a", "c": "b"}, {"p": "c", "c": "d"}])
  _jsonl(tmp_path / "eval.jsonl", [{"p": "x", "c": "y"}])
  seen = {}

  def resolve(vocabulary, task_name, train_texts):
    seen.update(vocabulary=vocabulary, name=task_name, texts=list(train_texts()))
    return seqio.ByteVocabulary()

  monkeypatch.setattr(vocab_lib, "resolve_vocabulary", resolve)
  vocabulary = vocab_lib.SentencePieceModel(path="vocab/sp.model", vocab_size=300)
  task = prompt_completion.prompt_completion_task(
      {"train": str(tmp_path / "train.jsonl"), "validation": str(tmp_path / "eval.jsonl")},
      vocabulary=vocabulary, prompt_field="p", completion_field="c")
  assert task.vocab_size == 300
  _read(task, "validation")
  assert seen["texts"] == [b"ab", b"cd"] and seen["name"] == task.name
  assert seen["vocabulary"].path == os.path.abspath("vocab/sp.model")


def test_names_differ_with_files_and_settings(tmp_path):
  a, b = _write(tmp_path / "a.txt", "a"), _write(tmp_path / "b.txt", "b")
  name = text_format.text_files_task({"train": a}).name
  assert text_format.text_files_task({"train": [a]}).name == name
  assert text_format.text_files_task({"train": b}).name != name
  assert text_format.text_files_task({"train": [a, b]}).name != name
  assert text_format.text_files_task({"validation": a}).name != name
  assert text_format.text_files_task({"train": a}, unit="line").name != name
  assert tfrecord.pretokenized_tfrecord_task({"train": a}, 10).name != (
      tfrecord.pretokenized_tfrecord_task({"train": a}, 11).name)


def test_patterns_that_match_nothing_are_refused(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  _write(tmp_path / "data" / "a.txt", "a")
  with pytest.raises(UsageError, match=r"^files\['train'\]='data/\*\.jsonl': matches no file; "
                     "check the pattern"):
    jsonl.json_lines_task({"train": "data/*.jsonl"})
  with pytest.raises(UsageError, match=r"^files\['train'\]\[1\]='data/b\.txt': no such file; "):
    text_format.text_files_task({"train": ["data/a.txt", "data/b.txt"]})
  with pytest.raises(UsageError, match=r"^files\['train'\]='data': is a folder, not a file; "
                     r"give a pattern of its files, e\.g\. 'data/\*'$"):
    text_format.text_files_task({"train": "data"})
  with pytest.raises(UsageError, match=r"^files=\{\}: is not a mapping of split names"):
    text_format.text_files_task({})
  with pytest.raises(UsageError, match=r"^unit='page': is not a document unit; "):
    text_format.text_files_task({"train": "data/a.txt"}, unit="page")


def test_an_empty_corpus_is_refused(tmp_path):
  _write(tmp_path / "a.txt", "")
  _write(tmp_path / "b.txt", "")
  _token_file(tmp_path / "t.tfrecords", [])
  with pytest.raises(UsageError, match=r"^files\['train'\]='.*/\*\.txt': every matched file is "
                     r"empty \(2 files\); "):
    text_format.text_files_task({"train": str(tmp_path / "*.txt")})
  with pytest.raises(UsageError, match="every matched file is empty"):
    tfrecord.pretokenized_tfrecord_task({"train": str(tmp_path / "t.tfrecords")}, 10)


def test_a_missing_vocabulary_file_is_refused(tmp_path):
  corpus = _write(tmp_path / "a.txt", "a")
  with pytest.raises(UsageError, match=r"^vocabulary='no/sp\.model': no such file; give a "):
    text_format.text_files_task({"train": corpus}, vocabulary="no/sp.model")
  with pytest.raises(UsageError, match=r"^vocabulary=SentencePieceModel\(.*\): is trained on "
                     r"the 'train' split, which files lacks \(it has \['test'\]\); "):
    text_format.text_files_task({"test": corpus}, vocabulary=vocab_lib.SentencePieceModel())


def test_an_unknown_field_or_column_is_refused_naming_the_file(tmp_path):
  good = _jsonl(tmp_path / "a.jsonl", [{"text": "a"}])
  bad = _jsonl(tmp_path / "b.jsonl", [{"body": "b", "id": 1}])
  with pytest.raises(UsageError, match=f"^text_field='text': {re.escape(bad)}: the first record "
                     r"has no such field \(its fields: \['body', 'id'\]\); set text_field"):
    jsonl.json_lines_task({"train": [good, bad]})
  with pytest.raises(UsageError, match=r"^completion_field='completion': .*/a\.jsonl: "):
    prompt_completion.prompt_completion_task({"train": good}, prompt_field="text")
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  pq.write_table(pa.table({"body": ["x"], "n": [1]}), tmp_path / "p.parquet")
  with pytest.raises(UsageError, match=r"^text_column='text': .*/p\.parquet: no such column "
                     r"\(its columns: \['body', 'n'\]\); "):
    parquet.parquet_task({"train": str(tmp_path / "p.parquet")})
  with pytest.raises(UsageError, match=r"^text_column='n': .*/p\.parquet: the column holds int64"):
    parquet.parquet_task({"train": str(tmp_path / "p.parquet")}, text_column="n")
  _write(tmp_path / "x.parquet", b"not parquet")
  with pytest.raises(DataError, match=r"^.*/x\.parquet: not a readable Parquet file \("):
    parquet.parquet_task({"train": str(tmp_path / "x.parquet")})
  tokens = _token_file(tmp_path / "t.tfrecords", [[1, 2]], feature="ids")
  task = tfrecord.pretokenized_tfrecord_task({"train": tokens}, vocab_size=10)
  with pytest.raises(UsageError, match=r"^feature='text': .*/t\.tfrecords: the first record "
                     r"has no int64 feature of that name \(its features: \['ids'\]\); "):
    _read(task)


def test_bad_text_is_reported_with_file_and_line(tmp_path):
  path = _write(tmp_path / "a.txt", b"fine\nfine\nbad \xff byte\n")
  for unit in ("file", "line"):
    message = _data_error(text_format.text_files_task({"train": path}, unit=unit))
    assert message.startswith(f"{path}: line 3: not valid UTF-8 (byte 0xff at offset ")
    assert "\n" not in message
  bad_json = _write(tmp_path / "b.jsonl", '{"text": "a"}\n\n{"text": "b"}\n{"text": oops}\n')
  assert _data_error(jsonl.json_lines_task({"train": bad_json})) == (
      f"{bad_json}: line 4: not valid JSON (Expecting value at column 10)")
  with pytest.raises(DataError, match=r"^.*/b\.jsonl: line 1: not valid JSON "):
    jsonl.json_lines_task({"train": _write(tmp_path / "b.jsonl", "{oops\n")})
  not_string = _jsonl(tmp_path / "c.jsonl", [{"text": "a"}, {"text": 7}])
  assert _data_error(jsonl.json_lines_task({"train": not_string})) == (
      f"{not_string}: line 2: field 'text' holds a int, not a string")


def test_bad_token_records_are_reported_with_file_and_record(tmp_path):
  path = _token_file(tmp_path / "a.tfrecords", [[1, 2], [3, 10, 4]])
  task = tfrecord.pretokenized_tfrecord_task({"train": path}, vocab_size=10)
  assert _data_error(task) == (f"{path}: record 1: token id 10 at position 1 is outside "
                               "[0, 10) (vocab_size=10)")
  data = open(path, "rb").read()  # pylint: disable=consider-using-with
  corrupt = _write(tmp_path / "c.tfrecords", data[:-3])  # The second record is cut short.
  task = tfrecord.pretokenized_tfrecord_task({"train": corrupt}, vocab_size=100)
  message = _data_error(task)
  assert message.startswith(f"{corrupt}: record 1: corrupt TFRecord (") and "\n" not in message


def test_data_error_from_ignores_other_errors():
  assert local_files.data_error_from(ValueError("no marker")) is None
  error = local_files.data_error_from(tf.errors.UnknownError(
      None, None, "{{node}} DataError: lingvo_lite.DataError: f.txt: line 2: bad\nTraceback"))
  assert str(error) == "f.txt: line 2: bad"
