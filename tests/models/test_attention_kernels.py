"""The table of attention kernels (models/attention_kernels/): what "auto" picks and why, what a
named kernel is refused for, the rows a call falls back to, and the field's values as the
table's names. Rules and words only here; the kernels' numbers are test_layers.py's,
test_flash_attention.py's and test_decode_attention.py's, and tests/test_one_row.py runs a kernel
registered at run time through every program."""

import types
import typing

import fiddle as fdl
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.lm import architectures
from lingvo_lite import fields, target
from lingvo_lite.errors import UsageError
from lingvo_lite.models import attention_kernels
from lingvo_lite.models import layers
from lingvo_lite.models.attention_kernels import Call, DecodeForm, DecodeStep, Kernel, einsum

_H100 = dict(platform="gpu", device_kind="NVIDIA H100", compute_capability="9.0")


@pytest.mark.parametrize("call, shown, scoreless", [
    (Call(**_H100, dtype="bfloat16", head_dim=64), "cudnn (auto on gpu)", ("cudnn", "xla")),
    (Call(**_H100, dtype="float32", head_dim=64),
     "xla (auto on gpu: cudnn needs model.dtype 'bfloat16' or 'float16' (got 'float32'))",
     ("xla",)),
    # A Hopper takes heads of 256 when cuDNN is named; "auto" keeps to what every GPU takes.
    (Call(**_H100, dtype="bfloat16", head_dim=256),
     "xla (auto on gpu: cudnn is picked for heads up to 128 wide (got 256; name it to use it))",
     ("cudnn", "xla")),
    # gpt-oss's sinks: neither fused kernel takes them.
    (Call(**_H100, dtype="bfloat16", head_dim=64, masks=frozenset({"sinks", "window"})),
     "einsum (auto on gpu: cudnn takes no sinks; xla takes no sinks)", ()),
    (Call("tpu", dtype="bfloat16", head_dim=64, masks=frozenset({"sinks"})),
     "splash (auto on tpu)", ("splash",)),
    (Call("cpu", device_kind="cpu"), "einsum (auto on cpu)", ()),
])
def test_auto_is_the_first_row_that_takes_the_model_and_says_why(call, shown, scoreless):
  choice = attention_kernels.choose("auto", call)
  assert (str(choice), choice.scoreless) == (shown, scoreless)
  assert choice.runs.holds_scores == (choice.name == "einsum")


def test_a_named_kernel_without_a_form_for_the_model_runs_its_fallback_and_says_so():
  choice = attention_kernels.choose("xla", Call("cpu", masks=frozenset({"sinks"})))
  assert (choice.name, choice.runs.name, str(choice)) == ("xla", "einsum",
                                                          "einsum (xla takes no sinks)")
  assert choice.runs.holds_scores  # What the memory check counts is what runs.
  assert str(attention_kernels.choose("paged", Call("tpu"))) == (
      "einsum (paged has no training form)")
  # Per call: a length splash's blocks do not divide, sinks the fused kernels do not take.
  assert attention_kernels.for_training("splash", Call("tpu", length=96)).name == "einsum"
  assert attention_kernels.for_training("splash", Call("tpu", length=384)).name == "splash"
  assert attention_kernels.for_training(
      "cudnn", Call("gpu", masks=frozenset({"segments", "sinks"}))).name == "einsum"


@pytest.mark.parametrize("name, device, message", [
    ("splash", types.SimpleNamespace(device_kind="NVIDIA H100", compute_capability="9.0"),
     "model.attention_implementation='splash': runs on tpu (interpreted on cpu), not on gpu; "
     "or use 'cudnn', 'einsum' or 'xla'"),
    ("paged", types.SimpleNamespace(device_kind="NVIDIA A100", compute_capability="8.0"),
     "model.attention_implementation='paged': runs on tpu (interpreted on cpu), not on gpu; "
     "or use 'cudnn', 'einsum' or 'xla'"),
    ("cudnn", types.SimpleNamespace(device_kind="Some GPU"),
     "model.attention_implementation='cudnn': needs an NVIDIA GPU (this device: Some GPU); "
     "or use 'einsum' or 'xla'"),
])
def test_a_named_kernel_the_target_cannot_run_is_one_line_naming_those_that_would(
    name, device, message):
  gpu = target.Target(name="local", platform="gpu", devices=(device,), memory_per_device=None,
                      memory_source="")
  model = fdl.build(architectures.llama(vocab_size=64, num_layers=1, dim=64, num_heads=4,
                                        attention_implementation=name, dtype="bfloat16"))
  with pytest.raises(UsageError) as error:
    model.validate(gpu)
  assert str(error.value) == message


def _row(name, **changes):
  return Kernel(**{"name": name, "description": "a test's", "platforms": ("cpu",),
                   "attend": lambda layer, q, k, v, segment_ids, sinks=None: q, **changes})


def test_the_field_accepts_exactly_the_tables_names():
  def accepted(value):
    hints = fields.type_hints(type(fdl.build(architectures.llama(
        vocab_size=64, num_layers=1, dim=64, num_heads=4))))
    return fields.matches(value, hints["attention_implementation"])

  assert typing.get_args(attention_kernels.AttentionImplementation) == (
      "auto", "splash", "cudnn", "xla", "einsum", "paged", "latent")
  assert not accepted("ours")
  with attention_kernels.registered(_row("ours")):
    assert accepted("ours") and attention_kernels.KERNELS["ours"].name == "ours"
    with pytest.raises(ValueError, match="named 'ours' exists already"):
      attention_kernels.register(_row("ours"))
  assert not accepted("ours") and "ours" not in attention_kernels.KERNELS
  for bad, match in [(_row("auto"), "exists already"), (_row("x", fallback="nowhere"),
                                                           "falls back to 'nowhere'"),
                     (_row("x", masks=frozenset({"alibi"})), "names masks")]:
    with pytest.raises(ValueError, match=match):
      attention_kernels.register(bad)
  with pytest.raises(ValueError, match="one of the table's own"):
    attention_kernels.unregister("einsum")


class _Layer:
  """What the decode forms ask of a layer: no prefix (so the paged kernel has no form)."""

  num_heads, head_dim = 2, 128

  def _cache_prefix(self, positions, entries):
    del positions, entries


def test_a_decode_step_takes_the_first_form_that_reads_its_cache_layout_and_fits():
  heads = jnp.zeros((1, 2, 128, 128), jnp.bfloat16)
  step = DecodeStep(_Layer(), jnp.zeros((1, 1, 2, 1, 128)), (heads, heads),
                    jnp.zeros((1, 1), jnp.int32), None)
  # paged decodes where its kernel fits, here not (no prefix): written out. splash decodes
  # written out everywhere (it beat the paged kernel on the chip).
  assert (attention_kernels.for_decoding("paged", "heads", step)
          is attention_kernels.KERNELS["einsum"].decode)
  assert (attention_kernels.for_decoding("splash", "heads", step)
          is attention_kernels.KERNELS["einsum"].decode)
  # Latent attention's cache takes the table's row that reads it, whatever is named.
  assert (attention_kernels.for_decoding("splash", "latent", step)
          is attention_kernels.KERNELS["latent"].decode)
  other = DecodeForm(layouts=("other",), attend=lambda step: step.q)
  with attention_kernels.registered(_row("other_cache", decode=other)):
    # A layer with a cache of another layout takes the row that reads it, whatever is named.
    assert attention_kernels.for_decoding("splash", "other", step) is other
  with pytest.raises(ValueError, match="end in no kernel"):
    attention_kernels.for_decoding("splash", "other", step)


def test_the_cache_layout_is_the_first_decode_form_that_keeps_one_for_the_model():
  """By head exactly where the paged kernel decodes the model (named; bfloat16, heads of a
  multiple of 128, on a TPU or interpreted on a CPU), and on CPUs; by position elsewhere
  (splash decodes written out); a registered form that reads one layout keeps it."""
  tpu = dict(platform="tpu", device_kind="TPU v5 lite")
  cases = [("splash", Call(**tpu, dtype="bfloat16", head_dim=128), "positions"),
           ("paged", Call(**tpu, dtype="bfloat16", head_dim=128), "heads"),
           ("paged", Call(**tpu, dtype="bfloat16", head_dim=256), "heads"),
           ("splash", Call(**tpu, dtype="bfloat16", head_dim=64), "positions"),  # SmolLM2
           ("splash", Call(**tpu, dtype="float32", head_dim=128), "positions"),
           ("einsum", Call(**tpu, dtype="bfloat16", head_dim=128), "positions"),
           ("xla", Call(**_H100, dtype="bfloat16", head_dim=128), "positions"),
           ("splash", Call("cpu", dtype="bfloat16", head_dim=128), "heads"),  # interpreted
           ("einsum", Call("cpu", dtype="float32", head_dim=64), "heads")]
  for name, call, layout in cases:
    assert attention_kernels.cache_layout(name, call) == layout, (name, call)
  own = DecodeForm(layouts=("other",), attend=lambda step: step.q)
  with attention_kernels.registered(_row("own_cache", decode=own)):
    assert attention_kernels.cache_layout("own_cache", Call("cpu")) == "other"
    # Where the row does not run, its fallback's form says.
    assert attention_kernels.cache_layout("own_cache", Call(**tpu)) == "positions"
  # A chain without a decode form keeps the heads order (a model trains with it; its decode
  # step is refused where it is taken).
  with attention_kernels.registered(_row("no_decode", decode_fallback=None)):
    assert attention_kernels.cache_layout("no_decode", Call("cpu")) == "heads"


@pytest.mark.parametrize("layout, window, positions, span", [
    ("heads", None, [3, 140, 200], 256),       # The longest slot within 256 of 512 entries.
    ("positions", None, [3, 60, 127], 128),    # Every slot within the first 128.
    ("positions", None, [3, 140, 511], 512),   # One slot at the end: all of them.
    ("heads", 200, [3, 60, 100], 128),         # A ring of 200 not yet full: a prefix.
    ("positions", 200, [3, 150, 420], 200),    # A ring that wrapped: all of it.
])
def test_a_decode_step_reads_the_shortest_span_holding_what_its_slots_see(
    layout, window, positions, span):
  """The written-out decode step (einsum's form) over a cache of 512 entries (a ring of 200):
  the softmax over each slot's visible entries, as a float64 NumPy computation gives it, with
  only the span of `read_spans` that holds the longest slot's prefix read: the entries past it
  are NaN, which any read of them would carry into the output (0 x NaN)."""
  slots, kv_heads, group, head_dim = 3, 2, 2, 16
  entries = window or 512
  layer = layers.Attention(num_heads=kv_heads * group, num_kv_heads=kv_heads,
                           head_dim=head_dim, window=window, implementation="einsum")
  rng = np.random.default_rng(0)
  keys, values = (rng.normal(size=(slots, kv_heads, entries, head_dim)) for _ in range(2))
  q = rng.normal(size=(slots, 1, kv_heads, group, head_dim))
  poisoned = [x.copy() for x in (keys, values)]
  for x in poisoned:
    x[:, :, span:] = np.nan
  stored = poisoned if layout == "heads" else [
      np.swapaxes(x, 1, 2).reshape(slots, entries, kv_heads * head_dim) for x in poisoned]
  position = jnp.asarray(positions, jnp.int32)[:, None]
  step = DecodeStep(layer, jnp.asarray(q, jnp.float32),
                    tuple(jnp.asarray(x, jnp.float32) for x in stored), position, None, layout)
  out = einsum.attend_cached(step)
  # Which entries each slot sees: a full layer 0..p; a ring (entry e holds the last position
  # p' <= p with p' % entries == e) those within the window, all of them once it wrapped.
  seen = np.arange(entries)[None, :] <= np.asarray(positions)[:, None]
  if window is not None:
    seen = seen | (np.asarray(positions)[:, None] >= entries)
  logits = np.einsum("bkgd,bksd->bkgs", q[:, 0], keys)
  logits = np.where(seen[:, None, None], logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  expected = np.einsum("bkgs,bksd->bkgd", weights / weights.sum(-1, keepdims=True), values)
  np.testing.assert_allclose(np.asarray(out).reshape(expected.shape), expected, rtol=1e-5,
                             atol=1e-5)
  assert einsum.read_spans(entries) == ((128, 256, 512) if window is None else (128, 200))
