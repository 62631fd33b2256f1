"""Model FLOPs per step against a count taken from the real parameter tree, and device peaks."""

import time
import types

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.lm import architectures
from lingvo_lite import mfu
from lingvo_lite.runtime import summaries

FAMILIES = {
    "gptj": architectures.gptj(vocab_size=300, num_layers=3, dim=64, num_heads=4, rotary_dim=8),
    "llama": architectures.llama(vocab_size=300, num_layers=3, dim=64, num_heads=4,
                                 num_kv_heads=2, mlp_dim=96),
    "gpt2": architectures.gpt2(vocab_size=300, num_layers=3, dim=64, num_heads=4,
                               max_length=32),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_matmul_parameters_match_the_parameter_tree(family):
  model = fdl.build(FAMILIES[family])
  params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0),
                                        jnp.zeros((1, 8), jnp.int32)))["params"]
  counted = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = jax.tree_util.keystr(path)
    # Kernels only: lookups (embeddings) and biases (2-D per-head ones too) are not matmuls.
    if len(leaf.shape) >= 2 and "embedding" not in name and "bias" not in name:
      counted += int(np.prod(leaf.shape))
  if model.tie_embeddings:
    counted += model.dim * model.vocab_size  # The unembedding reuses the embedding.
  assert model.matmul_parameters() == counted


def test_flops_formula_for_gptj_6b():
  model = fdl.build(architectures.gptj(vocab_size=50400, num_layers=28, dim=4096,
                                       num_heads=16, head_dim=256, rotary_dim=64,
                                       mlp_dim=16384))
  tokens = 512 * 2048
  matmuls = 28 * (4 * 4096 * 4096 + 2 * 4096 * 16384) + 4096 * 50400
  attention = 6 * 28 * 2048 * 16 * 256 * tokens  # Causal: half of 12 T H d per token.
  assert mfu.model_flops_per_step(model, 512, 2048) == 6 * matmuls * tokens + attention


@pytest.mark.parametrize("kind, tflops", [("NVIDIA H100 80GB HBM3", 989.0),
                                          ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                          ("TPU v5 lite", 197.0), ("TPU v4", 275.0),
                                          ("TPU v6 lite", 918.0), ("TPU v5p", 459.0)])
def test_datasheet_peaks(kind, tflops):
  peak, source = mfu.peak_flops_per_device(types.SimpleNamespace(device_kind=kind))
  assert peak == tflops * 1e12 and "datasheet" in source


def test_cpu_peak_is_measured_unless_configured():
  cpu = types.SimpleNamespace(device_kind="cpu")
  peak, source = mfu.peak_flops_per_device(cpu)
  assert peak > 1e9 and "2048^3" in source
  assert mfu.peak_flops_per_device(cpu, configured_tflops=2.5) == (2.5e12, "configured")


def test_a_measured_cpu_peak_is_kept_per_host_in_the_cache_folder(tmp_path, monkeypatch):
  """Measured once per host and cache folder for a day; another XLA_FLAGS (another split of
  the cores), no folder, a damaged file or a day later measures again."""
  measured = []
  def measure():
    measured.append(1)
    return 4.5e11 + len(measured)  # Each measurement is told apart by its value.
  monkeypatch.setattr(mfu, "measured_matmul_peak", measure)
  cpu = types.SimpleNamespace(device_kind="cpu")
  folder = str(tmp_path / "cache")
  first = mfu.peak_flops_per_device(cpu, cache_folder=folder)
  assert first == (4.5e11 + 1, mfu.MEASURED)
  assert mfu.peak_flops_per_device(cpu, cache_folder=folder) == (4.5e11 + 1, mfu.KEPT)
  assert len(measured) == 1
  # The configured value and the datasheet never measure.
  assert mfu.peak_flops_per_device(cpu, 2.5, folder) == (2.5e12, "configured")
  assert len(measured) == 1
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
  assert mfu.peak_flops_per_device(cpu, cache_folder=folder) == (4.5e11 + 2, mfu.MEASURED)
  monkeypatch.delenv("XLA_FLAGS")
  assert mfu.peak_flops_per_device(cpu, cache_folder=folder)[0] == 4.5e11 + 1
  assert mfu.peak_flops_per_device(cpu, cache_folder=None) == (4.5e11 + 3, mfu.MEASURED)
  kept = list((tmp_path / "cache").glob("*/*.json"))
  assert len(kept) == 2
  for path in kept:
    path.write_text('{"schema": 1, "flops_per_second": "fast"}')
  assert mfu.peak_flops_per_device(cpu, cache_folder=folder) == (4.5e11 + 4, mfu.MEASURED)
  assert mfu.peak_flops_per_device(cpu, cache_folder=folder) == (4.5e11 + 4, mfu.KEPT)
  now = time.time()
  monkeypatch.setattr(mfu.time, "time", lambda: now + mfu.KEPT_SECONDS + 1)
  assert mfu.peak_flops_per_device(cpu, cache_folder=folder) == (4.5e11 + 5, mfu.MEASURED)
  assert mfu.peak_flops_per_device(cpu, cache_folder=folder) == (4.5e11 + 5, mfu.KEPT)
  # A remote cache folder keeps JAX's programs only: measured each time, nothing made here.
  (tmp_path / "cwd").mkdir()
  monkeypatch.chdir(tmp_path / "cwd")
  for expected in (4.5e11 + 6, 4.5e11 + 7):
    assert mfu.peak_flops_per_device(cpu, cache_folder="gs://bucket/jax") == (expected,
                                                                           mfu.MEASURED)
  assert not list((tmp_path / "cwd").iterdir())


def test_throughput_report_over_the_steps_since_the_last_one(monkeypatch):
  """Hand-computed rates for 2 s per step: 8 devices, 6.4 TFLOP and 4096 tokens per step."""
  clock = iter([100.0, 120.0])  # Created at t=100; report after 10 steps, at t=120.
  monkeypatch.setattr(summaries.time, "perf_counter", lambda: next(clock))
  throughput = summaries.Throughput(start_step=5, total_steps=25, tokens_per_step=4096,
                                    flops_per_step=6.4e12, num_devices=8,
                                    peak_flops_per_device=1e12)
  throughput.add_data_wait(0.5)
  report = throughput.report(15)
  expected = {"step_time_s": 2.0, "steps_per_s": 0.5, "tokens_per_s": 2048.0,
              "model_tflop_per_step": 6.4, "tflops_per_device": 0.4, "mfu": 0.4,
              "data_wait_s": 0.05, "eta_s": 20.0,
              "compile_s": 0.0, "checkpoint_s": 0.0, "eval_s": 0.0}
  assert report.keys() == expected.keys()
  for key, value in expected.items():
    assert report[key] == pytest.approx(value), key


def test_a_busy_hosts_low_peak_is_raised_by_a_faster_step_and_kept(tmp_path, monkeypatch):
  """A peak measured while the host was busy (1 GFLOP/s kept) and steps that do 4: MFU reads
  100%, not 400%, and the steps' FLOP/s become the kept peak, which a later, lower
  measurement (a day on) does not replace, and a higher one does."""
  from lingvo_lite.programs import train  # pylint: disable=import-outside-toplevel
  measurements = iter([1e9, 2e9, 5e9])
  monkeypatch.setattr(mfu, "measured_matmul_peak", lambda: next(measurements))
  cpu = types.SimpleNamespace(device_kind="cpu")
  folder = str(tmp_path / "cache")
  peak, source = mfu.peak_flops_per_device(cpu, cache_folder=folder)
  assert (peak, source) == (1e9, mfu.MEASURED)
  said = []
  clock = iter([0.0, 10.0, 20.0])  # Two reports of 10 steps, 1 s a step.
  monkeypatch.setattr(summaries.time, "perf_counter", lambda: next(clock))
  throughput = summaries.Throughput(0, 100, 64, 8e9, 2, peak,
                                    train._peak_raiser(source, folder, said.append))
  for step in (10, 20):
    report = throughput.report(step)
    assert report["tflops_per_device"] == pytest.approx(4e-3)  # 8 GFLOP over 2 devices, 1 s.
    assert report["mfu"] == pytest.approx(1.0)
  assert len(said) == 1 and "peak raised to 0.004 TFLOP/s per device" in said[0]
  assert mfu.peak_flops_per_device(cpu, cache_folder=folder) == (4e9, mfu.STEP)
  now = time.time()
  monkeypatch.setattr(mfu.time, "time", lambda: now + mfu.KEPT_SECONDS + 1)
  assert mfu.peak_flops_per_device(cpu, cache_folder=folder) == (4e9, mfu.STEP)  # 2e9 < 4e9.
  monkeypatch.setattr(mfu.time, "time", lambda: now + 2 * mfu.KEPT_SECONDS + 2)
  assert mfu.peak_flops_per_device(cpu, cache_folder=folder) == (5e9, mfu.MEASURED)


def test_a_configured_peak_a_step_beats_is_raised_for_the_run_only(tmp_path, monkeypatch):
  monkeypatch.setattr(mfu, "measured_matmul_peak", lambda: pytest.fail("measured"))
  clock = iter([0.0, 10.0])
  monkeypatch.setattr(summaries.time, "perf_counter", lambda: next(clock))
  raised = []
  throughput = summaries.Throughput(0, 100, 64, 8e9, 1, 2e9, raised.append)
  assert throughput.report(10)["mfu"] == pytest.approx(1.0)
  assert raised == [pytest.approx(8e8 * 10)]
  assert mfu.raised_peak(8e9, "configured", str(tmp_path)) == (
      "configured, raised to a training step's own")
  assert not list(tmp_path.iterdir())
