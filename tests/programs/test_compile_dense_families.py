"""Today's dense families at their registered widths compile for their TPU topologies with a
verdict, as two-layer versions: a sliding and a full layer of Gemma 3 (one scanned group of
that pattern, so the TPU's flash kernel is traced with its local mask and without). The
vocabulary, widths, sequence, batch, micro-batches, sharding and remat are the registered
experiment's; the whole-depth compiles of every family are the README's benchmark table
(minutes each on this host).

The report counts what the model counts: its parameters, and FLOPs in which the sliding
layer's attention covers its window only.
"""

import json

import fiddle as fdl
import pytest

from lingvo_lite import testing
from lingvo_lite.config import overrides, registry

TWO_KINDS = ("--fdl.model.layer_kinds=('sliding', 'full')",)
# Gemma 3's pair covers the mechanisms (a scanned group of a sliding and a full layer, the
# kernel's local mask and the full one, the window's FLOPs); Qwen3_0_6B's and Olmo3_7B's
# two-layer compiles are the same programs at other widths (minutes on 2 cores): run them with
# `-k` where a change touches their shapes, and the whole-depth ones are the README's table.
CASES = [("Gemma3_1B", "v5e-8", TWO_KINDS)]


def _model(experiment, flags):
  cfg = registry.lookup(experiment).config()
  overrides.apply(cfg, [overrides.set_directive(flag, flag[len("--fdl."):])
                        for flag in flags], None)
  return fdl.build(cfg.model), cfg.train_data


@pytest.mark.slow
@pytest.mark.parametrize("experiment, topology, kinds", CASES, ids=[c[0] for c in CASES])
def test_two_layers_of_each_real_shape_compile_for_its_tpu_with_a_verdict(
    tmp_path, experiment, topology, kinds):
  try:
    import libtpu  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    pytest.fail(f"libtpu is not installed ({e}); bin/setup.sh installs it")
  flags = ("--fdl.model.num_layers=2", *kinds)
  job = tmp_path / "job"
  completed = testing.run_cli([f"--exp={experiment}", "--mode=compile",
                               f"--compile_topology={topology}", f"--job_log_dir={job}",
                               *flags])
  assert completed.code == 0, completed.stderr[-2000:]
  report = json.loads((job / "compile" / "report.json").read_text())
  assert report["verdict"] == "FITS" and "verdict: FITS:" in completed.stdout
  assert 0 < report["memory"]["deciding"] <= report["memory"]["available"]
  model, data = _model(experiment, flags)
  assert report["parameters"] == model.num_parameters()
  tokens = data.global_batch_size * data.sequence_length
  assert report["flops"]["model_per_step"] == pytest.approx(
      model.train_flops_per_token(data.sequence_length) * tokens, rel=1e-9)
  if kinds:  # The sliding layer's attention over its window: fewer FLOPs than a full one's.
    assert data.sequence_length > model.window
    all_full = model.clone(layer_kinds=("full",))
    assert model.attention_flops_per_token(data.sequence_length) < \
        all_full.attention_flops_per_token(data.sequence_length)
