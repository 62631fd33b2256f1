"""Remat policies (models/remat.py): each named policy keeps exactly the activations it names
for the backward pass, remat never changes a loss or a gradient, and host offload is refused
where there is no host memory apart from the device's."""

import contextlib
import io
import re
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite import target as targets
from lingvo_lite.errors import UsageError
from lingvo_lite.models import remat
from lingvo_lite.testing import synthetic_tiny_setup
from lingvo_lite.training.train_state import strip_boxes

# The names each policy keeps (on the device or moved to the host), from the module's table.
KEPT = {
    "minimal": {"query_proj", "key_proj", "value_proj", "out_proj", "mlp_in"},
    "minimal_with_context": {"query_proj", "key_proj", "value_proj", "attention_out",
                             "out_proj", "mlp_in"},
    "save_qkv_proj": {"query_proj", "key_proj", "value_proj"},
    "save_attention": {"query_proj", "key_proj", "value_proj", "attention_out"},
    "save_dot_except_mlp": {"query_proj", "key_proj", "value_proj", "attention_out",
                            "out_proj"},
    # Llama's MLP output is only added into the block's output: the backward never reads it.
    "save_dot_except_mlp_in": {"query_proj", "key_proj", "value_proj", "out_proj"},
    "full": set(),
}


def _model_and_params(policy, *sets):
  setup = synthetic_tiny_setup("PyCodeLlamaTiny", f"model.remat_policy='{policy}'", *sets)
  model = setup.model
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, 250, (2, 16)), jnp.int32)
  params = strip_boxes(jax.jit(model.init)(jax.random.key(0), tokens)["params"])
  return model, params, tokens


def _loss(model, tokens):
  return lambda params: jnp.mean(jax.nn.log_softmax(model.apply({"params": params}, tokens)))


@pytest.mark.parametrize("policy", sorted(KEPT))
def test_a_policy_keeps_exactly_the_activations_it_names(policy):
  assert _saved_names(*_model_and_params(policy)) == KEPT[policy]


def _saved_names(model, params, tokens):
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    jax.ad_checkpoint.print_saved_residuals(_loss(model, tokens), params)
  return set(re.findall(r"named '(\w+)'", printed.getvalue()))


def test_the_mlp_output_is_kept_where_a_norm_reads_it_in_the_backward():
  """After a post-MLP norm (OLMo's block), the backward reads the MLP's output: the policy
  that names it keeps it there, and a policy that does not recomputes it."""
  for policy, kept in (("save_dot_except_mlp_in", {"query_proj", "key_proj", "value_proj",
                                                   "out_proj", "mlp_out"}),
                       ("minimal", KEPT["minimal"])):
    assert _saved_names(*_model_and_params(policy, "model.block='post_norm'")) == kept


def test_remat_changes_no_loss_and_no_gradient():
  losses = {}
  for policy in ("none", "minimal", "save_dot_except_mlp_in"):
    model, params, tokens = _model_and_params(policy)
    losses[policy] = jax.jit(jax.value_and_grad(_loss(model, tokens)))(params)
  for policy in ("minimal", "save_dot_except_mlp_in"):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 losses[policy], losses["none"])


def test_the_field_accepts_exactly_the_policies_the_table_implements():
  assert typing.get_args(remat.RematPolicy) == tuple(remat.POLICIES)
  for policy in remat.POLICIES:
    assert (remat.policy_function(policy) is None) == (policy == "none")
  assert [p for p in remat.POLICIES if remat.offloads(p)] == ["qkv_proj_offloaded",
                                                             "minimal_offloaded"]


def test_host_offload_is_refused_on_a_cpu_and_accepted_for_a_tpu():
  setup = synthetic_tiny_setup("PyCodeLlamaTiny")
  offloaded = setup.model.clone(remat_policy="minimal_offloaded")
  with pytest.raises(UsageError, match=r"model.remat_policy='minimal_offloaded': moves "
                                       r"activations to host memory"):
    offloaded.validate(targets.compile_target("cpu:1"))
  offloaded.validate(targets.compile_target("v5e-8"))
