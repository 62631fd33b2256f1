"""Pipeline parallelism (models/pipeline.py): on 8 forced CPU devices, GPipe and the circular
schedule give one device's loss and gradients; a checkpoint saved at 4 stages restores at 2
and 1; settings a pipeline cannot run are one-line errors; the compile report's pipeline
section. The multi-device part runs tests/pipeline_worker.py in one child process (the device
count is fixed when JAX starts, and this process keeps one device).
"""

import json
import os
import subprocess
import sys

import pytest

from lingvo_lite.errors import UsageError
from lingvo_lite.models.pipeline import PipelineSettings, check as check_pipeline
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.programs.compile import pipeline_report, step_estimate
from tests import pipeline_worker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# float32: one device's numbers up to summation order.
TOLERANCE = 1e-5


@pytest.fixture(scope="module", name="worker")
def fixture_worker():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
  completed = subprocess.run([sys.executable, "-m", "tests.pipeline_worker"], env=env,
                             cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False)
  assert completed.returncode == 0, completed.stderr[-3000:]
  return json.loads(completed.stdout)


# A covering set of the 8 (bench/pipeline_numerics.py runs all of them).
@pytest.mark.parametrize("family,mesh,schedule", pipeline_worker.SUITE_CASES)
def test_pipelined_loss_and_gradients_equal_one_device(worker, family, mesh, schedule):
  case = worker[f"{family}/{mesh}/{schedule}"]
  assert case["same_names"]
  assert case["loss"] <= TOLERANCE and case["grads"] <= TOLERANCE, case
  # The stacked layers are split over the stage axis (and only they).
  specs = case["specs"]
  assert all(spec.startswith("P('stage'") for name, spec in specs.items()
             if name.startswith("['layers']")), specs
  assert not any("stage" in spec for name, spec in specs.items()
                 if not name.startswith("['layers']")), specs


@pytest.mark.parametrize("case", ["gemma3_remat_full", "llama_lora_remat_minimal",
                                  "mixtral_expert_axis"])
def test_the_pipeline_composes_with_kinds_remat_lora_and_experts(worker, case):
  losses = worker["composed"][case]
  assert len(losses["single"]) == 3
  for got, want in zip(losses["pipelined"], losses["single"]):
    assert abs(got - want) <= TOLERANCE * max(1.0, abs(want)), losses


@pytest.mark.parametrize("stages", ["stage2", "stage1"])
def test_a_checkpoint_of_4_stages_restores_bitwise_at_fewer(worker, stages):
  resumed = worker["resume"][stages]
  assert resumed["bitwise"]
  split = "P('stage',)" if stages == "stage2" else "P()"
  assert set(resumed["stage_split"]) == {split}
  # The next step: the 4-stage run's, up to summation order.
  assert resumed["loss"] <= TOLERANCE and resumed["params"] <= TOLERANCE, resumed


def test_eval_and_decode_run_a_pipelined_jobs_checkpoint_with_the_stages_folded(worker):
  folded = worker["folded"]
  assert folded["codes"] == [0, 0, 0], folded["stderr"]
  # Training evaluated its last step pipelined; the eval program, the stage axis folded away,
  # gives the same numbers from the checkpoint.
  (trained,), (evaluated,) = folded["train_eval"], folded["eval"]
  assert trained["step"] == evaluated["step"] == 2
  assert abs(trained["loss"] - evaluated["loss"]) <= TOLERANCE * max(1.0, trained["loss"])
  assert folded["decoded"]


@pytest.mark.parametrize("case,message", [
    ("stages_vs_layers", "partitioner.ici_stage=4: 4 stages x 1 repeats "
                         "(train.pipeline_repeats) do not divide model.num_layers=6"),
    ("stages_vs_kind_period", "do not divide model.num_layers=4 in groups of the layer "
                              "pattern's period 2"),
    ("microbatches_vs_rows", "train.pipeline_microbatches=3: does not divide the 4 rows"),
    ("unscanned", "model.scan_layers=False: a pipeline of 2 stages"),
    ("circular_microbatches", "train.pipeline_microbatches=2: the circular schedule"),
])
def test_bad_pipeline_settings_are_one_line_errors(worker, case, message):
  outcome = worker["bad"][case]
  assert outcome["code"] == 2
  lines = outcome["stderr"].strip().splitlines()
  assert len(lines) == 1 and message in lines[0], outcome["stderr"]


def test_stage_axes_across_slices_must_multiply_to_the_slices():
  with pytest.raises(UsageError, match=r"partitioner\.dcn_\*.*multiply to 2, but v5e-8 has 1"):
    Partitioner(dcn_stage=2).check_slices(1, "v5e-8", "tpu")
  Partitioner(dcn_stage=2, dcn_data=2).check_slices(4, "2xv5e-8", "tpu")


def test_folding_the_stage_axis_keeps_the_mesh_and_replicates_the_layers():
  for partitioner in (Partitioner(ici_stage=4), Partitioner(ici_stage=-1, ici_data=2),
                      Partitioner(ici_stage=2, ici_tensor=2), Partitioner(dcn_stage=2)):
    folded = partitioner.without_stages()
    assert partitioner.pipelines() and not folded.pipelines()
    assert folded.mesh_axis_sizes(16) == partitioner.mesh_axis_sizes(16)
    assert folded.mesh_axes_of(("layers", "embed", "mlp")) == [(), ("fsdp",), ("tensor",)]
  replicated = Partitioner(rules=(("layers", None),)).without_stages()
  assert replicated.rules == (("layers", None),)


@pytest.mark.parametrize("stages,micro,repeats", [(4, 1, 1), (4, 8, 1), (4, 4, 2), (2, 6, 3)])
def test_the_report_states_the_bubble_and_one_stages_bytes(stages, micro, repeats):
  settings = PipelineSettings(stages, micro, repeats)
  # Independently: a stage idles S - 1 of the loop's M R + S - 1 trips.
  assert settings.bubble_fraction == pytest.approx((stages - 1) / (micro * repeats + stages - 1))
  # The step-time estimate's bubble (programs/compile/step_estimate.py) is the same share.
  assert step_estimate.bubble_seconds(1.0, stages, micro, repeats) == pytest.approx(
      settings.bubble_fraction)
  section = {"stages": stages, "microbatches": micro, "repeats": repeats,
             "schedule": "gpipe" if repeats == 1 else "circular",
             "iterations": settings.iterations, "bubble_fraction": settings.bubble_fraction,
             "bubble_formula": pipeline_report.BUBBLE_FORMULA, "layers_per_stage": 2,
             "replica_rows": 8, "stage_bytes": 3 * 2**20,
             "stage_layer_parameter_bytes": 2**20, "other_parameter_bytes": 2**19}
  text = "\n".join(pipeline_report.lines(section))
  assert f"bubble {settings.bubble_fraction:.1%} of the loop" in text
  assert "3.000 MiB per device (a device holds one stage)" in text
  bound = [line for line in text.splitlines() if "bubble-bound" in line]
  assert len(bound) == (settings.bubble_fraction > 0.5)
  if bound:
    assert "train.pipeline_microbatches" in bound[0]
  # An estimate that was made says what dominates itself.
  assert not any("bubble-bound" in line
                 for line in pipeline_report.lines(section, {"made": True}))


def test_the_compile_report_of_a_pipeline(worker):
  compiled = worker["compile"]
  assert compiled["code"] == 0, compiled["stderr"]
  report = compiled["report"]
  assert report["mesh"] == {"stage": 4, "data": 2, "fsdp": 1, "expert": 1, "tensor": 1}
  pipeline = report["pipeline"]
  assert (pipeline["stages"], pipeline["microbatches"], pipeline["repeats"]) == (4, 2, 1)
  assert pipeline["bubble_fraction"] == pytest.approx(3 / 5)
  assert pipeline["layers_per_stage"] == 1 and pipeline["replica_rows"] == 4
  # One stage's bytes per device are the report's per-device bytes; its share of the stacked
  # layers is a quarter of theirs, counted from the model's parameter shapes.
  assert pipeline["stage_bytes"] == report["memory"]["deciding"]
  assert pipeline["stage_layer_parameter_bytes"] == compiled["stage_layer_bytes"]
  text = compiled["text"]
  assert "pipeline: gpipe, 4 stages x 2 microbatches x 1 repeat(s), 5 iterations; bubble " \
         "60.0% of the loop" in text
  assert "bubble-bound" in text and "train.pipeline_microbatches" in text


def test_a_prefix_before_the_scan_stays_out_of_the_stages():
  """DeepSeek's dense first layers (`scan_prefix`) run unrolled before the pipeline: the
  stages divide the layers after them, and a count they do not divide is one line saying so."""
  settings = PipelineSettings(2, 2)
  check_pipeline(settings, True, 5, 1, 8, prefix=1)  # 4 scanned layers: 2 a stage.
  with pytest.raises(UsageError) as raised:
    check_pipeline(settings, True, 4, 1, 8, prefix=1)
  message = str(raised.value)
  assert len(message.splitlines()) == 1
  assert ("partitioner.ici_stage=2: 2 stages x 1 repeats (train.pipeline_repeats) do not "
          "divide the 3 layers of model.num_layers=4 after the first 1") in message
  assert "make num_layers - 1 a multiple of 2" in message
  with pytest.raises(UsageError, match=r"do not divide model\.num_layers=5; make num_layers a "
                     "multiple of 2"):
    check_pipeline(settings, True, 5, 1, 8)  # No prefix: the whole stack's count.
