"""Data sources: determinism in (seed, step), host sharding, epochs, prefetching."""

import numpy as np
import pytest

from lingvo_lite.data.prefetch import Prefetcher
from lingvo_lite.data.source import example_indices, local_rows
from lingvo_lite.data.synthetic import SyntheticData
from lingvo_lite.errors import UsageError


def test_synthetic_batches_are_a_function_of_seed_and_step():
  data = SyntheticData(vocab_size=100, sequence_length=32, global_batch_size=4, seed=3)
  np.testing.assert_array_equal(data.batch(7)["inputs"], data.batch(7)["inputs"])
  assert not np.array_equal(data.batch(7)["inputs"], data.batch(8)["inputs"])
  other_seed = SyntheticData(vocab_size=100, sequence_length=32, global_batch_size=4, seed=4)
  assert not np.array_equal(data.batch(7)["inputs"], other_seed.batch(7)["inputs"])


def test_targets_are_inputs_shifted_by_one():
  batch = SyntheticData(vocab_size=100, sequence_length=32, global_batch_size=2).batch(0)
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])


@pytest.mark.parametrize("process_count", [2, 4])
def test_process_shards_concatenate_to_the_global_batch(process_count):
  data = SyntheticData(vocab_size=100, sequence_length=16, global_batch_size=8)
  whole = data.batch(5)
  parts = [data.batch(5, index, process_count) for index in range(process_count)]
  for key in whole:
    np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])


def test_local_rows_rejects_an_uneven_split():
  with pytest.raises(UsageError, match="not divisible"):
    local_rows(6, 0, 4)


def test_shuffled_indices_visit_every_example_once_per_epoch():
  num_examples, batch = 12, 4
  rows = np.arange(batch)
  epoch = np.concatenate([example_indices(step, rows, batch, num_examples, seed=0,
                                          shuffle=True) for step in range(3)])
  assert sorted(epoch) == list(range(num_examples))
  assert list(epoch) != list(range(num_examples))
  next_epoch = np.concatenate([example_indices(step, rows, batch, num_examples, 0, True)
                               for step in range(3, 6)])
  assert sorted(next_epoch) == list(range(num_examples))
  assert list(next_epoch) != list(epoch)


def test_unshuffled_indices_walk_in_order_and_wrap():
  np.testing.assert_array_equal(
      example_indices(2, np.arange(4), 4, 10, seed=0, shuffle=False), [8, 9, 0, 1])


def test_prefetcher_yields_every_step_in_order():
  data = SyntheticData(vocab_size=50, sequence_length=8, global_batch_size=2)
  got = [(step, batch["inputs"]) for step, batch in Prefetcher(data, 3, 9)]
  assert [step for step, _ in got] == list(range(3, 9))
  for step, inputs in got:
    np.testing.assert_array_equal(inputs, data.batch(step)["inputs"])


def test_prefetcher_reraises_source_errors():
  class Broken:
    def batch(self, step, process_index=0, process_count=1):
      raise OSError(f"corrupt record at step {step}")
  with pytest.raises(OSError, match="corrupt record at step 0"):
    list(Prefetcher(Broken(), 0, 3))
