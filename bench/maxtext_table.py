"""MaxText's published v5e table, reproduced on paper: each MaxText shape compiled from this CPU
for 1, 2, 4, 8, 16 and 32 slices of v5e-256, beside MaxText's measured TFLOP/s/chip and MFU;
and its largest v5p script's (1024b.sh: MaxText1024B on 1 and 2 slices of v5p-2048).

  python bench/maxtext_table.py [--rows MaxText16B,...] [--slices 1,2,4] [--limit_s 900]
      [--out bench/results/2026-12-07/maxtext_v2/maxtext_table] [--markdown_only]

Each row is `python -m lingvo_lite --exp=ROW --mode=compile --compile_topology=v5e-256
--compile_num_slices=K` (1024B: v5p-2048, `TOPOLOGY`) in its own process (the batch K x the script's per-slice batch, the
slices splitting it as MaxText's `dcn_data_parallelism: -1` does; the settings a CPU-built
config cannot carry from experiments/lm/maxtext.py's ON_TPU), under a wall-clock limit
(--limit_s: the process group is killed past it), with no compilation cache (a cached compile
would time nothing). A row records the verdict, the deciding bytes per chip and the terms they
are made of (XLA's arguments, outputs, aliased bytes, temporaries and peak; the state counted
from shapes; the ten largest buffers), the step-time estimate
(programs/compile/estimate_report.py) and the MFU it implies, its parts and the one that
dominates, the compile's wall time (process start to exit) and peak host memory (the child's
ru_maxrss from os.wait4). Rows go in size order (16B at 1 slice first) and are appended
to OUT.jsonl as each ends; a rerun skips the rows already there, so the table can be made over
several sittings. OUT.md is rewritten from OUT.jsonl after every row, by model and slice count.

MaxText's columns are its README's (MaxText/configs/v5e/README.md, commit 1de063ea; 1024B's
MaxText/configs/v5p/README.md). Its MFU is its TFLOP/s/chip over the chip's peak (v5e 197
TFLOP/s, v5p 459), as is the estimate's; its TFLOPs per step are
maxtext_utils.calculate_tflops_training_per_device's terms (weights' matmuls x 3 for the
backward, causal attention halved, the output projection), which `maxtext_flops` restates:
MaxText's step time is those FLOPs over its TFLOP/s. Where the estimate and MaxText's step
differ by more than 10%, `_attribution` names the estimate's term that accounts for it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# pylint: disable=wrong-import-position
from experiments.lm import maxtext  # Light: Fiddle configs, no JAX work.
# pylint: enable=wrong-import-position

SLICES = (1, 2, 4, 8, 16, 32)
V5E_PEAK = 197e12  # bf16 FLOP/s per chip, the datasheet's (MaxText's MFU divides by it).
# The slice each row's script runs on and its chips (v5e-256 unless named here).
TOPOLOGY = {"MaxText1024B": ("v5p-2048", 1024)}
# MaxText's README tables (TFLOP/s/chip, MFU %) by slice count; per_device_batch_size. A row
# is compiled only for the slice counts MaxText publishes.
PUBLISHED = {
    "MaxText16B": (6, {1: (120, 61.10), 2: (117, 59.37), 4: (117, 59.14), 8: (115, 58.27),
                       16: (111, 56.56), 32: (108, 54.65)}),
    "MaxText32B": (4, {1: (132, 66.86), 2: (128, 64.81), 4: (126, 64.10), 8: (125, 63.67),
                       16: (123, 62.26), 32: (119, 60.40)}),
    "MaxText64B": (2, {1: (118, 59.90), 2: (112, 56.66), 4: (110, 55.85), 8: (108, 54.96),
                       16: (105, 53.29), 32: (99, 50.18)}),
    "MaxText128B": (1, {1: (110, 56.06), 2: (110, 55.82), 4: (108, 54.93), 8: (104, 52.93),
                        16: (100, 50.86), 32: (91, 46.25)}),
    # configs/v5p/README.md (commit 1de063ea): 1 and 2 x v5p-2048; its MFU is over v5p's 459.
    "MaxText1024B": (2, {1: (254, 55.35), 2: (237, 51.55)}),
}


def maxtext_flops(scale: int, per_device_batch: int) -> float:
  """FLOPs per chip per step as MaxText counts them (its calculate_tflops_training_per_device
  for the llama2 block, restated): 3 x (2 FLOPs per weight and token: q, k, v, out, the three
  MLP matrices, the output projection) + 3 x causal attention (4 S^2 heads head_dim / 2)."""
  shape = maxtext.maxtext_shape(scale)
  dim, heads, mlp, layers = (shape["dim"], shape["num_heads"], shape["mlp_dim"],
                             shape["num_layers"])
  tokens = per_device_batch * maxtext.SEQUENCE
  hd = maxtext.HEAD_DIM
  per_layer = 2 * tokens * dim * (3 * mlp + 3 * heads * hd + heads * hd)
  weights = 3 * (layers * per_layer + 2 * tokens * dim * maxtext.VOCAB)
  attention = 3 * layers * 4 * per_device_batch * maxtext.SEQUENCE ** 2 * heads * hd / 2
  return weights + attention


def _scale(row: str) -> int:
  return int(row.removeprefix("MaxText").removesuffix("B"))


def _run(args: list[str], limit_s: float) -> tuple[float, float, int, bool, str]:
  """(wall s, peak RSS GiB, exit code, timed out, stderr tail) of `python -m lingvo_lite`."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  started = time.perf_counter()
  child = subprocess.Popen([sys.executable, "-m", "lingvo_lite", *args], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)
  killed = threading.Event()

  def kill() -> None:
    killed.set()
    os.killpg(child.pid, signal.SIGKILL)

  timer = threading.Timer(limit_s, kill)
  timer.start()
  stderr = child.stderr.read().decode(errors="replace")
  _, status, usage = os.wait4(child.pid, 0)
  timer.cancel()
  wall = time.perf_counter() - started
  return (wall, usage.ru_maxrss / 2**20, os.waitstatus_to_exitcode(status), killed.is_set(),
          stderr[-600:])


def _attribution(estimate: dict, maxtext_seconds: float) -> str:
  """Which term of the estimate accounts for its distance from MaxText's measured step."""
  seconds = estimate["seconds"]
  error = seconds / maxtext_seconds - 1
  if abs(error) <= 0.10:
    return ""
  parts = estimate["parts"]
  if error > 0:
    if parts["compute"] > 1.1 * maxtext_seconds:
      return (f"compute: the matmul term alone ({parts['compute'] * 1e3:.0f} ms) exceeds "
              "MaxText's step")
    extra = {k: v for k, v in parts.items() if k != "compute"}
    name = max(extra, key=extra.get)
    return (f"{name}: {extra[name] * 1e3:.0f} ms exposed beyond the matmuls' "
            f"{parts['compute'] * 1e3:.0f} ms")
  hidden = estimate.get("overlapped", {})
  dcn = parts.get("dcn", 0.0) + hidden.get("dcn", 0.0)
  return (f"every term together ({seconds * 1e3:.0f} ms) is under MaxText's step, "
          f"{(maxtext_seconds - seconds) * 1e3:.0f} ms short; the largest candidate, DCN: "
          f"{estimate['counted']['dcn_bytes'] / 1e6:.0f} MB a chip over the data-center "
          f"network, {dcn * 1e3:.0f} ms at its bandwidth, {hidden.get('dcn', 0.0) * 1e3:.0f} ms "
          "of it hidden behind kernels by XLA's asynchronous schedule")


def compile_row(row: str, slices: int, limit_s: float) -> dict:
  """One compile of `row` for `slices` x its slice (v5e-256, `TOPOLOGY`) and what its report
  says."""
  per_device, published = PUBLISHED[row]
  topology, slice_chips = TOPOLOGY.get(row, ("v5e-256", 256))
  batch = per_device * slice_chips * slices
  with tempfile.TemporaryDirectory(prefix="maxtext_table_") as job:
    args = [f"--exp={row}", "--mode=compile", f"--compile_topology={topology}",
            f"--compile_num_slices={slices}", f"--job_log_dir={job}/job",
            "--compilation_cache_dir=", f"--fdl.train_data.global_batch_size={batch}",
            f"--fdl.eval_data.global_batch_size={batch}"]
    args += [f"--fdl.{setting}" for setting in maxtext.ON_TPU.get(row, ())]
    wall, rss, code, timed_out, stderr = _run(args, limit_s)
    path = os.path.join(job, "job", "compile", "report.json")
    report = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else None
  tflops, mfu_percent = published[slices]
  maxtext_seconds = maxtext_flops(_scale(row), per_device) / (tflops * 1e12)
  out = {"row": row, "topology": topology, "slices": slices, "chips": slice_chips * slices,
         "global_batch_size": batch,
         "overrides": list(maxtext.ON_TPU.get(row, ())), "exit_code": code,
         "timed_out": timed_out, "limit_s": limit_s, "wall_s": wall, "peak_rss_gib": rss,
         "maxtext_tflops_per_chip": tflops, "maxtext_mfu": mfu_percent / 100,
         "maxtext_flops_per_chip": maxtext_flops(_scale(row), per_device),
         "maxtext_step_s": maxtext_seconds}
  if report is None:
    out["error"] = ("timed out" if timed_out else
                    (stderr.strip().splitlines() or ["no report"])[-1])
    return out
  estimate = report["estimate"] or {"made": False}
  out.update(verdict=report["verdict"], deciding_gib=(report["memory"]["deciding"] or 0) / 2**30,
             available_gib=(report["memory"]["available"] or 0) / 2**30,
             mesh=report["mesh"], compile_seconds=report["compile_seconds"],
             fit_knob=report.get("next_knob"), peak_gib=(report["memory"].get("peak") or 0)
             / 2**30, largest_buffers=report["largest_buffers"],
             model_flops_per_chip=report["flops"]["model_per_device"],
             # The deciding sum's terms and the state counted from shapes, to say which
             # buffers a DOES NOT FIT is made of.
             memory={k: report["memory"].get(k) for k in (
                 "arguments", "outputs", "aliased", "temporaries", "generated_code", "total",
                 "peak", "deciding_rule", "xla_error")},
             analytic_by_part=report["analytic"]["by_part"],
             remat_policy=report.get("remat_policy"), optimizer=report.get("optimizer"))
  if estimate.get("made"):
    out.update(estimate_s=estimate["seconds"], estimate_mfu=estimate["mfu"],
               parts=estimate["parts"], overlapped=estimate["overlapped"],
               counted=estimate["counted"], dominant=estimate["dominant"],
               next_knob=estimate["next_knob"],
               estimate_tflops_per_chip=report["flops"]["model_per_device"]
               / estimate["seconds"] / 1e12,
               step_error=estimate["seconds"] / maxtext_seconds - 1,
               attribution=_attribution(estimate, maxtext_seconds))
  else:
    out["estimate_reason"] = estimate.get("reason")
  return out


def _verdict_cell(r: dict) -> str:
  """The verdict by the compile report's rule of today: on a TPU, XLA's heap-simulated peak
  (compile_report.deciding; chosen 2026-12-07 after a v5e ran a step whose sum was past its
  memory). A row compiled under the earlier rule (the larger of the peak and the sum) is
  judged again from the peak it recorded, with the sum it was refused by beside it."""
  peak, available = r.get("peak_gib"), r["available_gib"]
  if not peak or r["deciding_gib"] <= peak + 1e-9:
    return f"{r['verdict']}, {r['deciding_gib']:.2f} of {available:.2f}"
  verdict = "FITS" if peak <= available else "DOES NOT FIT"
  return f"{verdict}, {peak:.2f} of {available:.2f} (XLA peak; the sum {r['deciding_gib']:.2f})"


def to_markdown(rows: list[dict]) -> str:
  """The table the README shows."""
  lines = ["| model | slices (chips) | verdict, GiB per chip | estimated step, MFU | "
           "MaxText step, TFLOP/s/chip, MFU | step error | compile wall, peak RSS | "
           "what accounts for a >10% difference |",
           "|---|---|---|---|---|---|---|---|"]
  # By model and slice count, whatever order the rows were compiled in.
  for r in sorted(rows, key=lambda r: (_scale(r["row"]), r["slices"])):
    topology = r.get("topology", "v5e-256")  # Rows before 1024B's: all v5e-256.
    where = (f"{r['slices']} ({r['chips']})" if topology == "v5e-256"
             else f"{r['slices']} x {topology} ({r['chips']})")
    maxtext_cell = (f"{r['maxtext_step_s'] * 1e3:.0f} ms, {r['maxtext_tflops_per_chip']}, "
                    f"{r['maxtext_mfu']:.2%}")
    cost = f"{r['wall_s']:.0f} s, {r['peak_rss_gib']:.2f} GiB"
    if "verdict" not in r:
      error = r.get("error")
      error = " ".join(error) if isinstance(error, list) else error  # Older rows: a list.
      error = str(error).removeprefix("lingvo_lite: error: ")
      what = (f"not compiled in {r['limit_s']:.0f} s" if r.get("timed_out")
              else f"refused before compiling: {error}")
      lines.append(f"| {r['row']} | {where} | {what} | | "
                   f"{maxtext_cell} | | {cost} | |")
      continue
    verdict = _verdict_cell(r)
    if "estimate_s" in r:
      estimate = (f"{r['estimate_s'] * 1e3:.0f} ms, {r['estimate_mfu']:.1%} "
                  f"({r['dominant']})")
      error = f"{r['step_error']:+.1%}"
    else:
      estimate, error = f"none: {r.get('estimate_reason')}", ""
    lines.append(f"| {r['row']} | {where} | {verdict} | {estimate} | {maxtext_cell} | "
                 f"{error} | {cost} | {r.get('attribution', '')} |")
  return "\n".join(lines) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default=",".join(PUBLISHED))
  parser.add_argument("--slices", default=",".join(map(str, SLICES)))
  parser.add_argument("--limit_s", type=float, default=900.0)
  # maxtext_v2: the step-time estimate's version 2 (2026-12-07/maxtext_table.* was version 1).
  parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "2026-12-07",
                                                    "maxtext_v2", "maxtext_table"))
  parser.add_argument("--markdown_only", action="store_true",
                      help="rewrite OUT.md from OUT.jsonl and compile nothing")
  args = parser.parse_args()
  done = []
  if os.path.exists(args.out + ".jsonl"):
    with open(args.out + ".jsonl", encoding="utf-8") as f:
      done = [json.loads(line) for line in f if line.strip()]
  seen = {(r["row"], r["slices"]) for r in done}
  if args.markdown_only:
    with open(args.out + ".md", "w", encoding="utf-8") as f:
      f.write(to_markdown(done))
    return
  for row in args.rows.split(","):
    for slices in map(int, args.slices.split(",")):
      if (row, slices) in seen or slices not in PUBLISHED[row][1]:
        continue
      result = compile_row(row, slices, args.limit_s)
      print(json.dumps(result), flush=True)
      done.append(result)
      with open(args.out + ".jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(result) + "\n")
      with open(args.out + ".md", "w", encoding="utf-8") as f:
        f.write(to_markdown(done))


if __name__ == "__main__":
  main()
