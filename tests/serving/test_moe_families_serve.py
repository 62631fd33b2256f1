"""Train, evaluate, decode, serve and score the mixture-of-experts families: PyCodeMixtralTiny,
PyCodeQwen3MoeTiny, PyCodeGptOssTiny and PyCodeDeepSeekV3Tiny (latent attention, its
selection bias) each train 3 steps on the stdlib data and evaluate one
batch (once per machine and code version: the shared trained-job cache, tests/trained_jobs.py),
then

- each logged row holds the routing statistics (balance loss, router z-loss, each expert's
  share of the choices, which sum to 1);
- `--mode=serve` answers OpenAI completions, greedy, with the text the decode program's
  generator gives offline, and the lm-evaluation-harness scores a lingvo_lite task on each
  job with the `lingvo_lite` model (one load serves, decodes and scores);
- `--mode=eval` reports the statistics beside the loss, and `--mode=decode` runs with the
  experts' weights in int8 (`int8_weights`; the router stays in float).
"""

import json
import math

import pytest

from lingvo_lite.testing import run_cli
from tests.serving.family_serving import serve_decode_and_score, trained_families

FAMILIES = {"deepseek_v3": "PyCodeDeepSeekV3Tiny", "gpt_oss": "PyCodeGptOssTiny",
            "mixtral": "PyCodeMixtralTiny", "qwen3_moe": "PyCodeQwen3MoeTiny"}
# Experts per token of each (the balance loss's value under an even routing).
PER_TOKEN = {"deepseek_v3": 2, "gpt_oss": 4, "mixtral": 2, "qwen3_moe": 4}
jobs = trained_families("moe_families", FAMILIES, "--fdl.train.log_every_steps=1")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_training_logs_the_routing_statistics(jobs, name):
  rows = [json.loads(line) for line in
          (jobs / "runs" / name / "metrics.jsonl").read_text().splitlines()]
  assert [row["step"] for row in rows] == [1, 2, 3]
  experts = 8
  for row in rows:
    shares = [row[f"expert_fraction/{e:03d}"] for e in range(experts)]
    assert math.isclose(sum(shares), 1.0, rel_tol=1e-5) and f"expert_fraction/{experts:03d}" \
        not in row
    # Balance gives k (the experts per token), and any routing at least about that.
    assert row["moe_load_balance"] > 0.9 * PER_TOKEN[name]
    assert row["moe_router_z"] >= 0 and row["moe_dropped"] == 0
    # DeepSeek-V3's selection bias: its loads' spread, and the bias moved by the rule.
    assert ("moe_load_cv" in row) == (name == "deepseek_v3")
  if name == "deepseek_v3":
    assert rows[-1]["moe_selection_bias_spread"] > 0


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_serve_and_lm_eval_run_on_each_family(jobs, name):
  """One load of the job (the harness's model) serves and decodes offline; gpt-oss's (sinks,
  a sliding ring cache, experts with biases) and DeepSeek-V3's (the latent cache) score too
  (the harness only forwards to the scorer the server's model runs)."""
  serve_decode_and_score(jobs / "runs" / name, name, score=name in ("deepseek_v3", "gpt_oss"))


def test_eval_reports_the_statistics_and_decode_runs_with_int8_expert_weights(jobs,
                                                                           monkeypatch):
  monkeypatch.chdir(jobs)
  evaluated = run_cli(["--mode=eval", "--job_log_dir=runs/mixtral",
                       "--fdl.eval_data.num_batches=2"])
  assert evaluated.code == 0, evaluated.stderr[-3000:]
  row = json.loads((jobs / "runs" / "mixtral" / "eval" / "eval_validation.jsonl").read_text()
                   .splitlines()[-1])
  assert row["moe_load_balance"] > 1.8 and math.isfinite(row["loss"])
  decoded = run_cli(["--mode=decode", "--job_log_dir=runs/mixtral", "--prompt=def main(",
                     "--fdl.model.quantization='int8_weights'", "--decode_out=-",
                     "--fdl.decode.max_new_tokens=8"])
  assert decoded.code == 0, decoded.stderr[-3000:]
  assert json.loads(decoded.stdout.strip().splitlines()[-1])["completion_ids"]
