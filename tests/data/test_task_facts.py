"""A task's facts (lingvo_lite/data/task_facts.py) are what its made seqio Task says: the store
key, the vocabulary's fingerprint, size and byte lengths, the metric functions, the text of ids
and the ids of text (data/text_vocabulary.py against seqio's vocabulary); and a run whose
stores are built trains, evaluates and decodes without importing TensorFlow."""

import os
import subprocess
import sys

import numpy as np
import pytest

from lingvo_lite.data import store_build, store_data, task_facts, vocabulary
from lingvo_lite.data.sentencepiece_training import train_sentencepiece
from lingvo_lite.data.text_vocabulary import TextVocabulary
from lingvo_lite.errors import UsageError
from lingvo_lite.testing import source_root
from tasks import pycode


def _source_folder(tmp_path):
  folder = tmp_path / "src"
  folder.mkdir()
  # Enough files that both splits have some (a file's split is a hash of its path).
  for i in range(40):
    (folder / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}  # module {i}\n" * 20)
  return folder


def _made(deferred):
  """The same task's made seqio Task: what a task without facts is asked through."""
  made = deferred.task
  assert task_facts.facts_of(made) is None
  return made


def _assert_facts_are_the_made_tasks(deferred):
  facts = task_facts.facts_of(deferred)
  assert facts is not None
  made = _made(deferred)
  for split in pycode.SPLITS:
    assert store_build.store_key(deferred, split) == store_build.store_key(made, split)
  made_vocabulary = made.output_features["targets"].vocabulary
  assert facts.vocabulary.fingerprint == vocabulary.fingerprint(made_vocabulary)
  assert facts.vocabulary.vocab_size == made_vocabulary.vocab_size == deferred.vocab_size
  np.testing.assert_array_equal(facts.vocabulary.token_byte_lengths(),
                                vocabulary.token_byte_lengths(made_vocabulary))
  assert store_data.metric_functions(deferred) == store_data.metric_functions(made) == ((), ())
  _assert_same_text(TextVocabulary(facts.vocabulary), made_vocabulary)


# Code, other scripts, a character no vocabulary here has a piece for, spaces, nothing.
TEXTS = ["def f1(x):\n    return x * 1  # module 1\n", "naïve café ß — 日本語 🙂\t\r\n",
         "\u2581 leading and  double  spaces ", "", "\x00\x7f"]


def _assert_same_text(ours, seqios):
  """Id for id and character for character, on text and on ids a model may emit: any id
  below the vocabulary size, PAD, EOS mid-sequence, UNK, ids past the vocabulary's size (a
  padded embedding), byte ids that make no whole UTF-8 character."""
  assert (ours.eos_id, ours.unk_id, ours.pad_id, ours.vocab_size) == (
      seqios.eos_id, seqios.unk_id, seqios.pad_id, seqios.vocab_size)
  for text in TEXTS:
    ids = list(seqios.encode(text))
    assert ours.encode(text) == ids, text
    assert ours.decode(ids) == seqios.decode(ids), text
  rng = np.random.default_rng(0)
  size = seqios.vocab_size
  cases = [list(range(size)), [0, 5, 1, 7, 8], [2, 3, 2], [size, size + 5, 3, 40],
           [0xE6 + 3, 0x97 + 3, 40, 41], [1], []]
  cases += [rng.integers(0, size + 64, n).tolist() for n in (1, 7, 50, 300)]
  for ids in cases:
    assert ours.decode(ids) == seqios.decode(ids), ids
    assert ours.decode(np.asarray(ids, np.int32)) == seqios.decode(ids), ids


def test_a_store_stream_gives_the_facts_vocabulary_else_the_made_tasks(tmp_path):
  folder = str(_source_folder(tmp_path))
  store = tmp_path / "stores"
  with_facts = store_data.StoreStream(task=pycode.pycode_task(folder), split="train",
                                      store_dir=str(store))
  assert isinstance(with_facts.text_vocabulary, TextVocabulary)
  without = store_data.StoreStream(task=_made(pycode.pycode_task(folder)), split="train",
                                   store_dir=str(store))
  assert type(without.text_vocabulary).__name__ == "ByteVocabulary"


def test_byte_task_facts_are_the_made_tasks(tmp_path):
  _assert_facts_are_the_made_tasks(pycode.pycode_task(str(_source_folder(tmp_path))))


@pytest.mark.parametrize("given_as", ["path", "SentencePieceModel"])
def test_sentencepiece_task_facts_are_the_made_tasks(tmp_path, given_as):
  folder = _source_folder(tmp_path)
  model = tmp_path / "vocab.model"
  train_sentencepiece(pycode.read_documents(str(folder), "train"), str(model), 300, "bpe")
  spec = (str(model) if given_as == "path" else
          vocabulary.SentencePieceModel(str(model), vocab_size=300, model_type="bpe"))
  _assert_facts_are_the_made_tasks(pycode.pycode_task(str(folder), vocabulary=spec))


def test_facts_wait_for_what_only_the_made_task_knows(tmp_path):
  folder = str(_source_folder(tmp_path))
  # A SentencePieceModel not trained yet: making the Task trains it.
  untrained = vocabulary.SentencePieceModel(str(tmp_path / "new.model"), 300, "bpe")
  assert task_facts.facts_of(pycode.pycode_task(folder, vocabulary=untrained)) is None
  # Metric functions: seqio checks their signatures when the Task is made.
  with_metrics = pycode.pycode_task(folder, metric_fns=[lambda targets, scores: {}])
  assert task_facts.facts_of(with_metrics) is None
  assert len(store_data.metric_functions(with_metrics)[0]) == 1


def test_facts_check_what_making_the_task_checks(tmp_path):
  folder = _source_folder(tmp_path)
  bad = tmp_path / "bad.model"
  bad.write_bytes(b"not a model")
  with pytest.raises(UsageError) as facts_error:
    task_facts.facts_of(pycode.pycode_task(str(folder), vocabulary=str(bad)))
  with pytest.raises(UsageError) as made_error:
    pycode.pycode_task(str(folder), vocabulary=str(bad)).task  # pylint: disable=expression-not-assigned
  assert str(facts_error.value) == str(made_error.value)
  only_train = tmp_path / "one"
  only_train.mkdir()
  (only_train / "a.py").write_text("x = 1\n")
  split = "validation" if pycode.split_of("a.py") == "train" else "train"
  task = pycode.pycode_task(str(only_train))
  with pytest.raises(UsageError, match=f"no .py file in the '{split}' split"):
    store_build.store_key(task, split)


def test_a_task_beam_sends_to_its_workers_works_out_its_facts_there(tmp_path):
  from apache_beam.internal import pickler  # pylint: disable=import-outside-toplevel
  task = pycode.pycode_task(str(_source_folder(tmp_path)))
  key = store_build.store_key(task, "train")  # Facts asked here first, then the task sent.
  copy = pickler.loads(pickler.dumps(task))
  assert copy is not task and copy.facts is not None
  assert store_build.store_key(copy, "train") == key


@pytest.mark.slow
def test_a_run_on_built_stores_never_imports_tensorflow(tmp_path):
  # The byte PyCode stores are built (once per machine) by this first run if need be. Nor does
  # a float run import qwix (int8 only: its flax.nnx import is start-up time of every process).
  args = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fdl.train.steps=2"]
  decode = ["--mode=decode", "--prompt=def main(", f"--job_log_dir={tmp_path / 'second'}"]
  script = ("import runpy, sys\n"
            "sys.argv = ['lingvo_lite'] + sys.argv[1:]\n"
            "try:\n"
            "  runpy.run_module('lingvo_lite', run_name='__main__')\n"
            "finally:\n"
            "  print('imported:', sorted(m for m in ('tensorflow', 'seqio', 'qwix')\n"
            "                            if m in sys.modules))\n")
  env = dict(os.environ)
  for job in ("first", "second"):
    completed = subprocess.run([sys.executable, "-c", script, *args,
                                f"--job_log_dir={tmp_path / job}"], cwd=source_root(), env=env,
                               capture_output=True, text=True, timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
  # The second run trained, evaluated and checkpointed on the stores the first one found or
  # built, and never made the Task.
  assert "eval  step 2 validation" in completed.stdout
  assert completed.stdout.strip().splitlines()[-1] == "imported: []", completed.stdout[-1000:]
  # Decoding its text neither.
  completed = subprocess.run([sys.executable, "-c", script, *decode], cwd=source_root(),
                             env=env, capture_output=True, text=True, timeout=600, check=False)
  assert completed.returncode == 0, completed.stderr[-2000:]
  assert "decoded 1 prompt(s)" in completed.stdout
  assert completed.stdout.strip().splitlines()[-1] == "imported: []", completed.stdout[-1000:]
