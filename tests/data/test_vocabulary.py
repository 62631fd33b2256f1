"""Vocabularies: byte-exact SentencePiece training, resolution, sizes and byte lengths."""

import fcntl
import json
import os
import subprocess
import sys
import threading

import pytest

from lingvo_lite.data import vocabulary

from lingvo_lite.data.sentencepiece_training import train_sentencepiece
from lingvo_lite.errors import UsageError
from tasks.pycode import pycode_task, read_documents, stdlib_dir
from tests import bin_tools

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CODE = b"def f():\n    return  1\n"


def json_task():
  """A small PyCode task (the stdlib's json package) for the command line's --task."""
  return pycode_task(os.path.join(stdlib_dir(), "json"))


@pytest.fixture(scope="module")
def validation():
  return read_documents(stdlib_dir(), "validation")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(path, summary) of a 512-piece unigram model from every 16th train file (~0.7 MB)."""
  path = tmp_path_factory.mktemp("vocab") / "pycode-unigram-512.model"
  texts = iter(read_documents(stdlib_dir(), "train")[::16])
  return path, train_sentencepiece(texts, str(path), 512, "unigram")


@pytest.fixture(scope="module")
def spm_vocab(trained):
  return vocabulary.resolve_vocabulary(str(trained[0]), "unused", lambda: [])


def test_training_writes_the_model_its_sidecar_and_no_temporary_file(trained):
  path, summary = trained
  assert summary["pieces"] == 512 and summary["documents"] > 30
  assert sorted(os.listdir(path.parent)) == [path.name, path.name + ".json"]
  sidecar = json.loads(path.with_name(path.name + ".json").read_text())
  assert sidecar["settings"]["normalization_rule_name"] == "identity"
  assert sidecar["summary"] == summary


def test_round_trip_is_byte_exact_over_the_validation_split(spm_vocab, validation):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (resolve imported it)
  encoded = [spm_vocab.encode(text.decode()) for text in validation]
  assert [spm_vocab.decode(ids).encode() for ids in encoded] == validation
  # The task pipeline tokenizes in TensorFlow (tf_text): the same ids.
  assert spm_vocab.encode_tf(tf.constant(validation)).to_list() == encoded
  assert sum(map(len, validation)) / sum(map(len, encoded)) > 1.5  # Bytes per token: 1.8.


def test_code_whitespace_survives(spm_vocab):
  ids = spm_vocab.encode(CODE.decode())
  assert spm_vocab.decode(ids).encode() == CODE
  assert len(ids) < len(CODE) / 2  # Indentation is not one token a space.


def test_token_byte_lengths_add_up_to_the_text(spm_vocab, validation):
  lengths = vocabulary.token_byte_lengths(spm_vocab)
  assert lengths.shape == (512,) and lengths[:3].tolist() == [0, 0, 0]
  assert set(lengths[3:259].tolist()) == {1}  # The byte-fallback pieces.
  total = sum(int(lengths[spm_vocab.encode(text.decode())].sum()) for text in validation)
  assert total == sum(map(len, validation))

  byte_vocab = vocabulary.resolve_vocabulary(None, "unused", lambda: [])
  byte_lengths = vocabulary.token_byte_lengths(byte_vocab)
  assert byte_lengths.sum() == 256
  assert byte_lengths[byte_vocab.encode(CODE.decode())].sum() == len(CODE)


def test_fingerprints(trained, spm_vocab):
  import seqio  # pylint: disable=g-import-not-at-top
  assert vocabulary.fingerprint(seqio.ByteVocabulary()) == "bytes:259"
  plain = vocabulary.fingerprint(spm_vocab)
  assert plain.startswith("sentencepiece:") and len(plain) == len("sentencepiece:") + 64
  with_extra = vocabulary.fingerprint(seqio.SentencePieceVocabulary(str(trained[0]), extra_ids=4))
  assert with_extra != plain and with_extra.endswith("+extra_ids:4")


def test_a_document_over_4192_bytes_is_learned_from(tmp_path):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  # "qwertyuiop" appears only past byte 4800 of the one long document.
  long = b"b = 2\n" * 800 + b"qwertyuiop = 3\n" * 300
  path = tmp_path / "long.model"
  train_sentencepiece([b"a = 1\n" * 50, long], str(path), 300, "bpe")
  processor = spm.SentencePieceProcessor(model_file=str(path))
  assert processor.encode("qwertyuiop", out_type=str) == ["qwertyuiop"]


def test_a_failed_training_leaves_no_file(tmp_path, validation):
  def texts():
    yield validation[0]
    raise RuntimeError("reader died")

  path = tmp_path / "out" / "x.model"
  with pytest.raises(RuntimeError, match="reader died"):
    train_sentencepiece(texts(), str(path), 300)
  # More pieces than the text has: SentencePiece's own failure, as one UsageError line.
  with pytest.raises(UsageError, match=r"^vocab_size=5000: more pieces than SentencePiece"):
    train_sentencepiece([b"x = 1\n" * 100], str(path), 5000)
  assert os.listdir(tmp_path) == []  # Nor the folder it made for the file.
  # A folder that was there stays, empty.
  path.parent.mkdir()
  with pytest.raises(UsageError, match=r"^vocab_size=5000: more pieces than SentencePiece"):
    train_sentencepiece([b"x = 1\n" * 100], str(path), 5000)
  assert os.listdir(path.parent) == []


@pytest.mark.parametrize("vocab_size, model_type, message", [
    (259, "unigram", r"^vocab_size=259: must be an int above 259"),
    (1024.0, "unigram", r"^vocab_size=1024.0: must be an int"),
    (1024, "word", r"^model_type='word': unknown SentencePiece model type; choose from unigram"),
])
def test_bad_settings_fail_before_reading(vocab_size, model_type, message, tmp_path):
  with pytest.raises(UsageError, match=message):
    train_sentencepiece(iter(()), str(tmp_path / "x.model"), vocab_size, model_type)


def test_a_missing_model_is_a_usage_error():
  message = (r"^vocabulary='/no/such.model': no such SentencePiece model file; train one with "
             r"bin/train_vocab.py or give an existing .model$")
  with pytest.raises(UsageError, match=message):
    vocabulary.resolve_vocabulary("/no/such.model", "unused", lambda: [])
  with pytest.raises(UsageError, match=message):
    vocabulary.vocabulary_size("/no/such.model")


def test_a_model_is_trained_once_then_loaded(trained, tmp_path, monkeypatch):
  monkeypatch.setenv("LINGVO_LITE_DATA_DIR", str(tmp_path))
  calls = []

  def texts():
    calls.append(1)
    return [CODE * 20, b"import os\nprint(os.getcwd())\n" * 20]

  spec = vocabulary.SentencePieceModel(vocab_size=300, model_type="bpe")
  first = vocabulary.resolve_vocabulary(spec, "tiny", texts)
  second = vocabulary.resolve_vocabulary(spec, "tiny", texts)
  assert calls == [1] and first.vocab_size == second.vocab_size == 300
  assert (tmp_path / "vocab" / "tiny-bpe-300.model").exists()
  # The file holds 512 pieces: asking for another size is refused, not silently used.
  with pytest.raises(UsageError, match=r"^vocabulary.vocab_size=1024: the model at .* has 512"):
    vocabulary.resolve_vocabulary(vocabulary.SentencePieceModel(str(trained[0])), "x", texts)


def test_a_second_process_waits_for_the_trainer_and_loads_its_model(trained, tmp_path):
  path = tmp_path / "shared.model"
  spec = vocabulary.SentencePieceModel(str(path), vocab_size=512)
  calls, result = [], []
  with open(f"{path}.lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # Another trainer holds the lock...
    waiter = threading.Thread(
        target=lambda: result.append(vocabulary.resolve_vocabulary(spec, "x", calls.append)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not calls
    path.write_bytes(trained[0].read_bytes())  # ...and finishes its model.
  waiter.join(10)
  assert not calls and result[0].vocab_size == 512


def test_sizes_need_no_tensorflow(trained):
  script = ("import sys\nfrom lingvo_lite.data import vocabulary as v\n"
            f"print(v.vocabulary_size(None), v.vocabulary_size(v.SentencePieceModel()), "
            f"v.vocabulary_size({str(trained[0])!r}))\n"
            "assert 'tensorflow' not in sys.modules and 'seqio' not in sys.modules\n")
  done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                        text=True, env={**os.environ, "PYTHONPATH": REPO}, check=False)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == ["259", "1024", "512"]


def test_padded_vocab_size():
  assert vocabulary.padded_vocab_size(259) == 384
  assert vocabulary.padded_vocab_size(1024) == 1024
  assert vocabulary.padded_vocab_size(50257) == 50304
  assert vocabulary.padded_vocab_size(50257, 400) == 50400


def _train_vocab(*flags):
  # As a user runs it: this process's TensorFlow import set its own log level.
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  return subprocess.run([sys.executable, "bin/train_vocab.py", *flags], cwd=REPO,
                        capture_output=True, text=True, check=False,
                        env={**env, "PYTHONPATH": "."})


def _train_vocab_here(monkeypatch, capfd, *flags):
  """bin/train_vocab.py's main in this process, from the repository root as _train_vocab runs
  it: (exit code, stdout, stderr)."""
  monkeypatch.chdir(REPO)
  capfd.readouterr()  # Not the tool's.
  code = bin_tools.tool("train_vocab").main(list(flags))
  out, err = capfd.readouterr()
  return code, out, err


# The first case runs as a user runs the tool (a process: the class's real one), the others in
# this process (~1 s of start-up each).
@pytest.mark.parametrize("flags, message", [
    (["--task=no_such.task"], "--task='no_such.task': no module named 'no_such'"),
    (["--task=tasks.pycode.nothing"], "--task='tasks.pycode.nothing': module tasks.pycode has "
     "no function 'nothing'"),
    (["--vocab_size=259"], "--vocab_size=259: must be an int above 259"),
    (["--vocab_size=big"], "argument --vocab_size: invalid int value: 'big'"),
    (["--model_type=word"], "--model_type='word': unknown SentencePiece model type"),
    (["--output=bin/train_vocab.py/x.model"], "--output='bin/train_vocab.py/x.model': cannot be "
     "written"),
])
def test_the_command_line_refuses_bad_input_in_one_line(flags, message, monkeypatch, capfd):
  args = ("--task=tasks.pycode.pycode_task", "--output=vocab_test_out/x.model", *flags)
  if flags == ["--task=no_such.task"]:
    done = _train_vocab(*args)
    code, out, err = done.returncode, done.stdout, done.stderr
  else:
    code, out, err = _train_vocab_here(monkeypatch, capfd, *args)
  assert code == 2, err
  assert err.startswith(f"train_vocab: error: {message}")
  assert err.count("\n") == 1 and not out
  assert not os.path.exists(os.path.join(REPO, "vocab_test_out"))


def test_the_command_line_trains_a_model(tmp_path, monkeypatch, capfd):
  output = os.path.relpath(tmp_path / "json.model", REPO)  # Relative, as users write it.
  done = _train_vocab("--task=tests.data.test_vocabulary.json_task", "--split=train",
                      "--vocab_size=400", "--model_type=bpe", f"--output={output}")
  assert done.returncode == 0, done.stderr
  assert "4 documents" in done.stdout and "400 pieces" in done.stdout
  assert vocabulary.vocabulary_size(str(tmp_path / "json.model")) == 400
  # A split the task does not have fails after the task is made: still one line, exit 2. The
  # tool's main in this process (the table above runs this class, exit 2, as a process; a
  # process here would load TensorFlow and the task again, ~7 s on 2 cores).
  code, out, err = _train_vocab_here(monkeypatch, capfd,
                                     "--task=tests.data.test_vocabulary.json_task",
                                     "--split=test", f"--output={output}")
  assert code == 2 and err.count("\n") == 1 and not out, err
  assert "--split='test': is not a split of pycode_bytes_" in err
