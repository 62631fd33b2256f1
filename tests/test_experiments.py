"""Generated smoke tests: every registered experiment, shrunk by the `tiny` fiddler, builds,
validates, shapes its state and lowers its train step on CPU."""

import jax
import pytest

from lingvo_lite import executor
from lingvo_lite.config import registry
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.testing import assert_experiment_lowers, tiny_config


@pytest.mark.parametrize("name", sorted(registry.all_experiments()))
def test_tiny_experiment_lowers(name):
  setup = executor.build(tiny_config(name))
  lowered = assert_experiment_lowers(setup)
  state_shapes, metrics = lowered.out_info
  assert state_shapes.step.shape == ()
  assert set(metrics) >= {"loss", "learning_rate", "tokens"}
  assert ("grad_norm" in metrics) == setup.train.log_grad_norm


@pytest.mark.parametrize("name", sorted(registry.all_experiments()))
def test_full_size_experiment_validates_and_has_shapes(name):
  """The real config (not tiny) builds and validates; its state is shaped, not allocated."""
  setup = executor.build(registry.lookup(name).config())
  abstract = JittedSteps(setup).sharded_state.abstract
  leaves = jax.tree.leaves(abstract)
  assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
