"""`--mode=compile --compile_program=decode`: the decode functions compiled for a target, the
KV cache per device against a count by hand, the verdict, the largest decode.slots, and the
command lines it refuses."""

import json
import pathlib

import pytest

from lingvo_lite.testing import run_process, synthetic_tiny_setup

TINY = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
        "--fdl.train_data.global_batch_size=8", "--fdl.eval_data.global_batch_size=8",
        "--mode=compile", "--compile_program=decode"]
# 4096 positions of 2 layers x 4 kv heads x 16 dims of float32 keys and values: 4 MiB a slot,
# and a prefill of 16 tokens, so the cache is what grows with the slots.
LONG_CACHE = ["--fdl.model.max_length=4096", "--fdl.decode.cache_length=4096",
              "--fdl.decode.prefill_buckets=(16,)"]


def _report(job: pathlib.Path) -> dict:
  return json.loads((job / "compile" / "report.json").read_text())


def _cache_bytes(slots: int, cache_length: int) -> int:
  """By hand: keys and values x layers x slots x kv heads x positions x head dim x float32."""
  model = synthetic_tiny_setup("PyCodeTiny").model
  layers, heads, head_dim = model.num_layers, model.resolved_num_kv_heads, model.resolved_head_dim
  assert (layers, heads, head_dim, model.dtype) == (2, 4, 16, "float32")
  total = 2 * layers * slots * heads * cache_length * head_dim * 4
  assert total == model.cache_bytes(slots, cache_length)
  return total


def test_cpu8_data_by_tensor_reports_both_functions_and_the_cache_per_device(tmp_path):
  job = tmp_path / "job"
  # The vocabulary splits over tensor=2 (PyCode's 259 ids do not).
  vocab = [f"--fdl.{part}.vocab_size=260" for part in ("model", "train_data", "eval_data")]
  completed = run_process([*TINY, *vocab, "--fdl.partitioner.ici_tensor=2",
                       "--compile_topology=cpu:8", f"--job_log_dir={job}"])
  assert completed.returncode == 0, completed.stderr
  report = _report(job)
  assert report["program"] == "decode" and report["verdict"] == "FITS"
  assert report["mesh"] == {"stage": 1, "data": 4, "fsdp": 1, "expert": 1, "tensor": 2}
  assert report["decode"] == {"slots": 8, "slots_per_device": 2, "cache_length": 64,
                              "prefill_bucket": 64, "prefill_buckets": [16, 32, 64]}
  # Slots over the 4 data-parallel ways, the 4 kv heads over the 2 tensor ways.
  cache = report["kv_cache"]
  assert cache["bytes_total"] == _cache_bytes(8, 64)
  assert cache["bytes_per_device"] == _cache_bytes(8, 64) // (4 * 2) == 64 * 2**10
  # One layer's keys [slots, kv_heads, cache_length, head_dim] (the tiny model's layers are
  # unrolled, an array each), this device's shard.
  assert cache["shape"] == [8, 4, 64, 16] and cache["shard_shape"] == [2, 2, 64, 16]
  # By head on a CPU (the einsum form's choice there: models/attention_kernels/einsum.py).
  assert cache["layout"] == "heads"
  assert cache["dimensions"] == ["slots", "kv_heads", "entries", "head_dim"]
  functions = report["functions"]
  for name in ("generate", "prefill"):
    f = functions[name]
    assert f["verdict"] == "FITS" and f["aliased"] >= cache["bytes_per_device"], (name, f)
    assert f["total"] == (f["arguments"] + f["outputs"] - f["aliased"] + f["temporaries"]
                          + f["generated_code"])
  memory = report["memory"]
  assert memory["deciding"] == max(f["deciding"] for f in functions.values())
  assert functions[memory["deciding_function"]]["deciding"] == memory["deciding"]
  # The generate loop's arguments as counted from the sharded shapes are XLA's, exactly.
  analytic = report["analytic"]
  assert analytic["total"] == analytic["xla_arguments"] == functions["generate"]["arguments"]
  assert analytic["by_part"]["kv_cache"] == cache["bytes_per_device"]
  assert 0 < analytic["by_part"]["parameters"] < analytic["total"]
  text = (job / "compile" / "report.txt").read_text()
  assert text.startswith("compile of the decode functions")
  assert "decode.slots 8 (2 per device), decode.cache_length 64" in text
  assert "KV cache per device: 64.000 KiB of 512.000 KiB" in text and "verdict: FITS" in text
  assert ("[slots, kv_heads, entries, head_dim] of layer 0's array (layout 'heads')" in text)


def test_cache_larger_than_the_target_does_not_fit(tmp_path):
  job = tmp_path / "job"
  # 262144 slots over 8 devices: 128 GiB of cache per device.
  completed = run_process([*TINY, *LONG_CACHE, "--fdl.decode.slots=262144",
                       "--compile_topology=cpu:8", f"--job_log_dir={job}"])
  assert completed.returncode == 3, completed.stderr
  report = _report(job)
  assert report["verdict"] == "DOES NOT FIT" and report["margin"]["bytes"] < 0
  assert report["kv_cache"]["bytes_per_device"] == _cache_bytes(262144, 4096) // 8 == 128 * 2**30
  assert report["memory"]["deciding"] > report["kv_cache"]["bytes_per_device"]
  assert "verdict: DOES NOT FIT" in completed.stdout


def test_refused_command_lines_are_one_line(tmp_path):
  cases = [(["--fdl.decode.slots=6"], "decode.slots=6: must split evenly over the "
            "data-parallel size 8"),
           ([f"--compiled_step_out={tmp_path / 'step'}"],
            "--compiled_step_out: only the train step is saved")]
  for extra, fragment in cases:
    completed = run_process([*TINY, "--compile_topology=cpu:8", *extra])
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2 and len(lines) == 1, (extra, completed.stderr)
    assert fragment in lines[0], (extra, lines[0])
  assert not (tmp_path / "step").exists()


@pytest.mark.slow
def test_find_max_batch_finds_the_largest_slots_with_compiles_on_both_sides(tmp_path):
  job = tmp_path / "job"
  completed = run_process([*TINY, *LONG_CACHE, "--compile_topology=cpu:8",
                       "--compile_find_max_batch", f"--job_log_dir={job}"])
  assert completed.returncode == 0, completed.stderr
  search = _report(job)["max_slots"]
  best, unit = search["max_slots"], search["unit"]
  assert unit == 8 and best and best % unit == 0 and best >= 2 * unit, search
  made = {c["slots"]: c for c in search["compiles"]}
  assert made[8]["fits"]  # The report's own compile (decode.slots=8) is one of them.
  assert made[best]["fits"] and not made[best + unit]["fits"], search
  # Each slot on a device adds at least its 4 MiB of cache.
  assert search["line"]["bytes_per_slot"] >= _cache_bytes(1, 4096)
  assert "largest decode.slots that fits" in completed.stdout


def test_tpu_v5e8_decode_compile(tmp_path):
  try:
    import libtpu  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    pytest.fail(f"libtpu is not installed ({e}): bin/setup.sh installs it")
  job = tmp_path / "job"
  completed = run_process([*TINY, "--compile_topology=v5e-8", f"--job_log_dir={job}"])
  assert completed.returncode == 0, completed.stderr
  assert completed.stderr.strip() == "", completed.stderr  # libtpu's warnings kept out
  report = _report(job)
  assert report["target"]["platform"] == "tpu" and report["verdict"] == "FITS"
  assert report["mesh"] == {"stage": 1, "data": 8, "fsdp": 1, "expert": 1, "tensor": 1}
  assert report["kv_cache"]["bytes_per_device"] == _cache_bytes(8, 64) // 8
  # On a TPU a float32 cache is decoded written out, so it is by position (unpadded tiles:
  # models/kv_cache.py): [slots, entries, 4 kv heads x 16], a slot per device.
  cache = report["kv_cache"]
  assert (cache["layout"], cache["shape"], cache["shard_shape"]) == (
      "positions", [8, 64, 64], [1, 64, 64])
  assert cache["dimensions"] == ["slots", "entries", "kv_heads * head_dim"]
  assert all(f["peak"] for f in report["functions"].values())
