"""The PyCode seqio Task: a fixed split by file, one document per file, read through its store."""

import os

import numpy as np
import pytest

from lingvo_lite.data.seqio_data import SeqioData
from lingvo_lite.data.store_data import TokenStoreData
from lingvo_lite.data.source import check_ready
from lingvo_lite.errors import UsageError
from tasks import pycode

ROOT = pycode.stdlib_dir()
LENGTH = 128


@pytest.fixture(scope="module", name="validation")
def fixture_validation():
  # The validation split's store, built once per machine (LINGVO_LITE_DATA_DIR).
  return TokenStoreData(task=pycode.pycode_task(), split="validation", sequence_length=LENGTH,
                        global_batch_size=4, shuffle=False)


def test_split_is_by_file_fixed_and_disjoint():
  train, validation = (pycode.source_files(ROOT, split) for split in pycode.SPLITS)
  assert not set(train) & set(validation)
  assert 0.05 < len(validation) / (len(train) + len(validation)) < 0.15
  assert pycode.source_files(ROOT, "validation") == validation  # Deterministic.
  assert all(pycode.split_of(path) == "validation" for path in validation)
  assert not any(part in pycode.EXCLUDED_DIRECTORIES
                 for path in train for part in path.split(os.sep)[:-1])


def test_examples_are_the_documents_joined_with_eos_and_cut(validation):
  documents = pycode.read_documents(ROOT, "validation")
  stream = np.concatenate([np.append(np.frombuffer(d, np.uint8).astype(np.int32) + 3, 1)
                           for d in documents])
  count = validation.num_examples(LENGTH)
  assert count == -(-len(stream) // LENGTH)  # The last, partial window is kept (padded).
  examples = validation.windows(np.arange(count), LENGTH)
  np.testing.assert_array_equal(examples["targets"][examples["weights"] > 0], stream)
  # Inputs are targets shifted right within each document, 0 (BOS) at a document's start.
  starts = examples["positions"] == 0
  np.testing.assert_array_equal(np.where(starts, 0, np.roll(examples["targets"], 1, axis=1)),
                                examples["inputs"])
  assert (examples["weights"].sum(axis=1)[:-1] == LENGTH).all()


def test_batches_are_a_function_of_step(validation):
  shuffled = TokenStoreData(task=validation.task, split="validation", sequence_length=LENGTH,
                            global_batch_size=4, seed=5)
  np.testing.assert_array_equal(shuffled.batch(3)["targets"], shuffled.batch(3)["targets"])
  assert not np.array_equal(shuffled.batch(3)["targets"], shuffled.batch(4)["targets"])
  np.testing.assert_array_equal(validation.batch(1)["targets"],
                                validation.windows(np.arange(4, 8), LENGTH)["targets"])


def test_missing_source_folder_is_reported():
  with pytest.raises(UsageError, match="source_dir='/no/such/dir': no such folder"):
    pycode.pycode_task("/no/such/dir")


def test_a_folder_without_python_files_is_refused_when_the_task_is_made(tmp_path):
  (tmp_path / "notes.txt").write_text("x")
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests" / "test_a.py").write_text("x = 1\n")  # Excluded: still no documents.
  with pytest.raises(UsageError, match=r"source_dir='.*': has no \.py files \(outside "):
    pycode.pycode_task(str(tmp_path))


def _folder(tmp_path, files):
  for name in files:  # `v8.py` is in the validation split, `a.py` in train.
    assert pycode.split_of(name) == ("validation" if name == "v8.py" else "train")
    (tmp_path / name).write_text("x = 1\n")
  return pycode.pycode_task(str(tmp_path))


def test_a_split_without_files_is_refused_before_a_program_runs(tmp_path):
  task = _folder(tmp_path, ["a.py"])  # A small folder may have no validation file...
  train = TokenStoreData(task=task, split="train", sequence_length=4, global_batch_size=1,
                         store_dir=str(tmp_path / "stores" / "train"), build_workers=1)
  check_ready("train_data", train)  # ...and need none.
  validation = TokenStoreData(task=task, split="validation", sequence_length=4,
                              global_batch_size=1, store_dir=str(tmp_path / "stores" / "v"))
  with pytest.raises(UsageError, match=r"^eval_data\.task\.source_dir='.*': has no \.py file "
                                       r"in the 'validation' split"):
    check_ready("eval_data", validation)


@pytest.mark.parametrize("task, message", [
    (None, "task=None: is a NoneType, not a seqio Task"),
    ("pycode", "task='pycode': is a str, not a seqio Task"),
])
@pytest.mark.parametrize("source", ["seqio", "store"])
def test_a_source_without_a_task_is_refused_when_it_is_built(task, message, source):
  with pytest.raises(UsageError) as error:
    if source == "seqio":
      SeqioData(task, "train", 4, global_batch_size=1)
    else:
      TokenStoreData(task=task, split="train", sequence_length=4, global_batch_size=1)
  assert str(error.value).startswith(message)
