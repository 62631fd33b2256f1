"""The PyCode seqio Task: a fixed split by file, bytes in, fixed-length examples out."""

import os

import numpy as np
import pytest

from lingvo_lite.data.seqio_data import SeqioData
from lingvo_lite.errors import UsageError
from tasks import pycode

ROOT = pycode.stdlib_dir()
LENGTH = 128


@pytest.fixture(scope="module", name="validation")
def fixture_validation():
  return SeqioData(pycode.pycode_task(), "validation", LENGTH, global_batch_size=4,
                   shuffle=False)


def test_split_is_by_file_fixed_and_disjoint():
  train, validation = (pycode.source_files(ROOT, split) for split in pycode.SPLITS)
  assert not set(train) & set(validation)
  assert 0.05 < len(validation) / (len(train) + len(validation)) < 0.15
  assert pycode.source_files(ROOT, "validation") == validation  # Deterministic.
  assert all(pycode.split_of(path) == "validation" for path in validation)
  assert not any(part in pycode.EXCLUDED_DIRECTORIES
                 for path in train for part in path.split(os.sep)[:-1])


def test_examples_are_the_documents_joined_with_eos_and_chunked(validation):
  documents = pycode.read_documents(ROOT, "validation")
  stream = np.concatenate([np.append(np.frombuffer(d, np.uint8).astype(np.int32) + 3, 1)
                           for d in documents])
  examples = validation.examples
  count = len(stream) // LENGTH
  assert examples["targets"].shape == (count, LENGTH)
  np.testing.assert_array_equal(examples["targets"].reshape(-1), stream[:count * LENGTH])
  # Inputs are targets shifted right with 0 (BOS) first; every target token counts.
  np.testing.assert_array_equal(examples["inputs"][:, 1:], examples["targets"][:, :-1])
  assert (examples["inputs"][:, 0] == 0).all()
  assert (examples["weights"] == 1).all()


def test_batches_are_a_function_of_step(validation):
  shuffled = SeqioData(validation.task, "validation", LENGTH, global_batch_size=4, seed=5)
  np.testing.assert_array_equal(shuffled.batch(3)["targets"], shuffled.batch(3)["targets"])
  assert not np.array_equal(shuffled.batch(3)["targets"], shuffled.batch(4)["targets"])
  np.testing.assert_array_equal(validation.batch(1)["targets"],
                                validation.examples["targets"][4:8])


def test_missing_source_folder_is_reported():
  with pytest.raises(UsageError, match="source_dir='/no/such/dir': no such folder"):
    pycode.pycode_task("/no/such/dir")
