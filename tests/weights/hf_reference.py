"""transformers' own models as the reference for the Hugging Face families (test_hf_folders.py,
test_hf_dense_families.py, test_hf_moe_families.py): a tiny random model made from a config
(offline) with every weight moved off its initial value (ones and zeros hide a swapped scale),
our reading of what it saved, both sides' float32 logits, the decode program's greedy tokens
against transformers' `generate`, and an export the format refuses.

torch and transformers are imported when asked for: the test modules skip without them.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

import jax
import numpy as np

from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.testing import run_cli
from lingvo_lite.weights.hf_checkpoint import HfCheckpoint

TOLERANCE = 1e-4  # Max abs over every position's float32 logits.
# Greedy tokens decoded; a different token is allowed only where transformers' top-2 logits
# are nearer than this (float32 noise may pick either).
GREEDY_TOKENS, NEAR_TIE = 32, 1e-4


def reference_model(spec: tuple[str, str, dict[str, Any]], vocab: int,
                    in_out: Callable[[Any, Any], bool] | None = None, **ids: int) -> Any:
  """The transformers model of `spec` (config class, model class, config fields) with `vocab`
  tokens and the special `ids` (bos_token_id=0, ...): vectors (norm scales, biases) moved by
  0.2 noise, matrices set to noise of ~1/sqrt(fan-in) for O(1) logits; a matrix is [out, in]
  unless `in_out(model, parameter)` (gpt-oss's stacked experts)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  config_class, model_class, fields = spec
  torch.manual_seed(0)
  config = getattr(transformers, config_class)(vocab_size=vocab, **ids, **fields)
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  model = getattr(transformers, model_class)(config).eval()
  perturb(model, torch.Generator().manual_seed(1), in_out)
  return model


def perturb(model: Any, generator: Any, in_out: Callable[[Any, Any], bool] | None = None
            ) -> None:
  """`reference_model`'s weights drawn from `generator`, in the model's parameter order."""
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    for _, parameter in model.named_parameters():
      noise = torch.randn(parameter.shape, generator=generator)
      if parameter.ndim == 1:
        parameter.add_(0.2 * noise)
      else:
        stored_in_out = in_out is not None and in_out(model, parameter)
        fan_in = parameter.shape[-2] if stored_in_out else parameter.shape[-1]
        parameter.copy_(noise / math.sqrt(fan_in) * 1.5)


def saved(root: Any, cases: Any, make: Callable[[str], Any],
          logits: Callable[[str, Any], Any]) -> dict[str, tuple[Any, Any]]:
  """case -> (its folder under `root`, `logits(case, model)`), each case's model (`make`)
  written there by `save_pretrained`."""
  found = {}
  for case in cases:
    model = make(case)
    model.save_pretrained(root / case)
    found[case] = (root / case, logits(case, model))
  return found


def their_logits(model: Any, tokens: np.ndarray) -> np.ndarray:
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    return model(torch.tensor(tokens)).logits.numpy()


def load(path: Any, source: type = HfCheckpoint, **changes: Any) -> tuple[Any, Any, str]:
  """(the model `source` (a folder or file) describes, with `changes`, its parameters as our
  reader places them, what was loaded)."""
  family, fields = source(str(path)).model_fields()
  model = family(**dict(fields, **changes))
  abstract = MeshParams(model, 16, Partitioner(), Partitioner().make_mesh()).abstract
  params, loaded = source(str(path)).read_params(model, abstract)
  return model, params, loaded


def our_logits(model: Any, params: Any, tokens: np.ndarray) -> np.ndarray:
  with jax.default_matmul_precision("highest"):  # Read when the function is traced.
    return np.asarray(jax.jit(model.apply)({"params": params}, tokens))


def assert_close(got: np.ndarray, expected: np.ndarray, what: str) -> None:
  assert np.std(expected) > 0.5, "logits too small to show an error"
  error = np.abs(got - expected).max()
  assert error < TOLERANCE, f"{what}: max abs logit difference {error:.2e}"


def assert_greedy_decode_equals_generate(model: Any, folder: Any, prompt: list[int],
                                         tmp_path: Any) -> None:
  """`--mode=decode` of a new job over `folder` (`--init_from`; ids given as ids, no stop at
  EOS) gives transformers' `generate` of `model` (greedy, GREEDY_TOKENS), or differs first
  where transformers' top-2 logits are a near-tie."""
  import torch  # pylint: disable=g-import-not-at-top
  (tmp_path / "requests.jsonl").write_text(json.dumps(
      {"prompt_ids": prompt, "max_new_tokens": GREEDY_TOKENS, "temperature": 0.0}) + "\n")
  result = run_cli(["--mode=decode", "--exp=PyCodeTiny", "--fiddler=synthetic_data",
                    f"--init_from=hf:{folder}", f"--job_log_dir={tmp_path / 'job'}",
                    f"--prompts_file={tmp_path / 'requests.jsonl'}", "--decode_out=-",
                    "--fdl.decode.stop_at_eos=False", "--fdl.decode.slots=1"])
  assert result.code == 0, result.stderr[-3000:]
  ours = json.loads(result.stdout.strip().splitlines()[-1])["completion_ids"]
  model.generation_config.eos_token_id = None
  with torch.no_grad():
    # The attention mask given: inferred, it would mask the prompt's ids equal to pad's.
    generated = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(
        1, len(prompt), dtype=torch.long), max_new_tokens=GREEDY_TOKENS, do_sample=False,
                               pad_token_id=0)
  theirs = generated[0, len(prompt):].tolist()
  assert len(ours) == len(theirs) == GREEDY_TOKENS
  if ours != theirs:
    at = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    with torch.no_grad():
      logits = model(torch.tensor([prompt + theirs[:at]])).logits[0, -1].numpy()
    top2 = np.sort(logits)[-2:]
    gap = float(top2[1] - top2[0])
    assert gap < NEAR_TIE, (f"token {at} differs ({ours[at]} vs {theirs[at]}) where "
                            f"transformers' top-2 logit gap is {gap:.2e}, not a near-tie "
                            f"(< {NEAR_TIE})")


def tensors(folder: Any) -> dict[str, np.ndarray]:
  """Every tensor of a folder's safetensors files, by name."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  found = {}
  for file in sorted(folder.glob("*.safetensors")):
    found.update(load_file(str(file)))
  return found


def assert_same_tensors(folder: Any, out: Any) -> None:
  """`out` holds the tensors of `folder`, name for name, dtype for dtype, bit for bit."""
  expected, got = tensors(folder), tensors(out)
  assert sorted(got) == sorted(expected)
  for name, tensor in expected.items():
    assert got[name].dtype == tensor.dtype and got[name].tobytes() == tensor.tobytes(), name


def export(job: Any, out: Any, *extra: str) -> Any:
  return run_cli(["--mode=export", "--exp=PyCodeTiny", f"--job_log_dir={job}",
                  f"--export_dir={out}", *extra])


def exported_again(folder: Any, tmp_path: Any, model_class: str) -> Any:
  """transformers' `from_pretrained` of `--mode=export` of a new job over `folder`
  (`--init_from`), once the export holds the folder's tensors bit for bit (the names
  `save_pretrained` wrote) and loads as `model_class`."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  result = export(tmp_path / "job", tmp_path / "out", f"--init_from=hf:{folder}")
  assert result.code == 0, result.stderr[-3000:]
  assert_same_tensors(folder, tmp_path / "out")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path / "out", dtype=torch.float32, attn_implementation="eager").eval()
  assert type(reloaded).__name__ == model_class
  return reloaded


def assert_refused_in_one_line(result: Any, words: str, out: Any) -> None:
  """An export refused with exit 2, one line holding `words`, and nothing written."""
  assert result.code == 2 and words in result.stderr, result.stderr
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert not out.exists()
