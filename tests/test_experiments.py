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


# MaxText's published configurations (experiments/lm/maxtext.py): (experiment,
# global_parameter_scale, per_device_batch_size, chips of the slice its batch is for).
MAXTEXT = [("MaxText16B", 16, 6, 256), ("MaxText32B", 32, 4, 256), ("MaxText64B", 64, 2, 256),
           ("MaxText128B", 128, 1, 256), ("MaxText1024B", 1024, 2, 1024)]


def _maxtext_sizes(scale):
  """base.yml's sizes grown as pyconfig.py's get_individual_scales grows them, restated as a
  walk: doubling after doubling, the heads and MLP width, then the model width, then the
  layers, round and round (the experiments compute the same by divmod)."""
  sizes = {"dim": 2048, "heads": 16, "mlp": 7168, "layers": 16}
  for doubling in range(scale.bit_length() - 1):
    for name in {0: ("heads", "mlp"), 1: ("dim",), 2: ("layers",)}[doubling % 3]:
      sizes[name] *= 2
  return sizes


@pytest.mark.parametrize("name,scale,per_device_batch,chips", MAXTEXT)
def test_maxtext_experiments_have_maxtexts_shapes_and_parameter_count(name, scale,
                                                                      per_device_batch, chips):
  setup = executor.build(registry.lookup(name).config())
  model, sizes = setup.model, _maxtext_sizes(scale)
  assert (model.dim, model.num_heads, model.resolved_num_kv_heads, model.resolved_head_dim,
          model.resolved_mlp_dim, model.num_layers, model.vocab_size) == (
              sizes["dim"], sizes["heads"], sizes["heads"], 128, sizes["mlp"], sizes["layers"],
              32000)
  # MaxText's llama2 block, weight by weight: q, k, v and out (heads x 128 wide each), the
  # SwiGLU's three matrices, two RMSNorm scales a layer; the final norm, the embedding and the
  # untied output projection.
  dim, width = sizes["dim"], sizes["heads"] * 128
  layer = 4 * dim * width + 3 * dim * sizes["mlp"] + 2 * dim
  assert model.num_parameters() == sizes["layers"] * layer + dim + 2 * 32000 * dim
  assert (model.norm, model.mlp_activation, model.tie_embeddings, model.rotary_base) == (
      "rmsnorm", "swiglu", False, 10000.0)
  data = setup.train_data
  assert (data.global_batch_size, data.sequence_length) == (per_device_batch * chips, 2048)
  assert setup.train.grad_accum_steps == 1 and model.scan_layers
