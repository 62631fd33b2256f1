"""LoRA adapters to and from Hugging Face PEFT (lingvo_lite/weights/peft.py), against `peft` and
`transformers` themselves (torch CPU, float32, eager attention): a tiny Llama with adapters that
`peft` made gives transformers' logits after `--init_from=peft:`; a LoRA job's
`--export_format=peft` loads in `peft.PeftModel.from_pretrained` with the job's logits; its
merged `--export_format=hf` computes what the unmerged adapters do; decode runs the adapter job
itself.

Weights are scaled for O(1) logits and the adapters made non-zero (a zero B hides every layout
error), as tests/weights/hf_reference.py does for plain weights."""

import fiddle as fdl
import jax
import numpy as np
import pytest
from etils import epath

from lingvo_lite.config import building
from lingvo_lite.data.synthetic import SyntheticData
from lingvo_lite.experiment import TrainLoop, setup_config
from lingvo_lite.models import lora
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.testing import run_cli
from lingvo_lite.training.objectives.objective import Forward
from lingvo_lite.training.optimizers import AdamW
from lingvo_lite.weights import sources
from lingvo_lite.weights.job_params import JobParams
from tests.weights import hf_reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

VOCAB, LENGTH = 96, 48
TOLERANCE = 1e-4  # Max abs over float32 logits of magnitude ~5, as for plain weights.


def config() -> fdl.Config:
  """A Setup without a model (--init_from=hf: or peft: gives it), on synthetic tokens."""
  return setup_config(
      optimizer=fdl.Config(AdamW, peak_learning_rate=2e-2, warmup_steps=0, weight_decay=0.0),
      train_data=fdl.Config(SyntheticData, vocab_size=VOCAB, sequence_length=32,
                            global_batch_size=2),
      train=fdl.Config(TrainLoop, steps=3, log_every_steps=1))


def _base():
  return transformers.LlamaForCausalLM.from_pretrained(
      str(FOLDERS["base"]), dtype=torch.float32, attn_implementation="eager").eval()


FOLDERS = {}


@pytest.fixture(scope="module", autouse=True)
def folders(tmp_path_factory):
  """A tiny Llama (grouped heads) saved by transformers, and LoRA adapters on three of its
  projections saved by peft, their A and B random."""
  root = tmp_path_factory.mktemp("peft")
  torch.manual_seed(0)
  config_ = transformers.LlamaConfig(
      vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=128,
      rms_norm_eps=1e-5)
  config_._attn_implementation = "eager"  # pylint: disable=protected-access
  model = transformers.LlamaForCausalLM(config_).eval()
  generator = torch.Generator().manual_seed(1)
  hf_reference.perturb(model, generator)
  model.save_pretrained(root / "base")
  adapted = peft.get_peft_model(model, peft.LoraConfig(
      r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"]))
  with torch.no_grad():
    for name, parameter in adapted.named_parameters():
      if "lora_" in name:
        parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
  adapted.save_pretrained(root / "adapter")
  FOLDERS.update(base=root / "base", adapter=root / "adapter", root=root)
  yield FOLDERS


def _tokens():
  return np.random.default_rng(0).integers(0, VOCAB, (1, LENGTH))


def _torch_logits(model):
  with torch.no_grad():
    return model(torch.tensor(_tokens())).logits.numpy()


def _setup(init_from, *assignments):
  cfg = config()
  building.set_parts(cfg, sources.config_parts(init_from, cfg))
  for assignment in assignments:
    path, value = assignment
    building.set_parts(cfg, {path: value})
  return building.build(cfg)


def _ours(setup, job_dir):
  """(the merged model's logits, the adapted model's: base and adapters apart)."""
  tokens = _tokens()
  with jax.default_matmul_precision("highest"):
    opened = JobParams(setup, epath.Path(job_dir))
    merged, _ = opened.load()
    merged_logits = np.asarray(jax.jit(setup.model.apply)({"params": merged}, tokens))
    jitted = JittedSteps(setup, opened.mesh)
    with jitted.activated():
      frozen, _ = jitted.frozen.load()
      choice = opened.choose()
      if choice.step is not None:
        adapters = jitted.restore_params(choice.checkpointer, choice.step)
      else:
        adapters, _ = choice.source.load_adapters(jitted.mesh_params())
      unmerged = np.asarray(jax.jit(lambda a, f: Forward(jitted.model, f, adapters=True).logits(
          a, {"inputs": tokens}))(adapters, frozen))
  return merged_logits, unmerged


def test_peft_adapters_give_transformers_logits(tmp_path):
  """--init_from=peft:ADAPTERS,base=hf:BASE sets the model and train.lora from the folders
  and computes what peft's PeftModel does, adapters merged or apart."""
  init_from = f"peft:{FOLDERS['adapter']},base=hf:{FOLDERS['base']}"
  setup = _setup(init_from)
  assert (setup.train.lora.rank, setup.train.lora.alpha) == (4, 8.0)
  assert lora.check_targets(setup.train.lora, setup.model, 32) == [
      f"layer_{i}/{kernel}" for i in range(2)
      for kernel in ("attention/query_kernel", "attention/value_kernel", "mlp/wo/kernel")]
  reference = _torch_logits(peft.PeftModel.from_pretrained(_base(), str(FOLDERS["adapter"])))
  merged, unmerged = _ours(setup, tmp_path / "job")
  assert np.abs(merged - reference).max() < TOLERANCE
  assert np.abs(unmerged - reference).max() < TOLERANCE
  assert np.abs(reference - _torch_logits(_base())).max() > 0.1  # The adapters matter.


def test_a_lora_jobs_exports_load_in_peft_and_transformers_with_its_logits(tmp_path,
                                                                            monkeypatch):
  """A LoRA job trained three steps over the hf: base: its --export_format=peft loads in
  PeftModel.from_pretrained over the base with the job's logits; --export_format=hf merges the
  adapters, and the merged weights compute what the adapters apart do (to 1e-5 of the logits'
  scale)."""
  monkeypatch.chdir(tmp_path)
  base = str(FOLDERS["base"])
  trained = run_cli(["--fdl_config=tests.weights.test_peft.config", f"--init_from=hf:{base}",
                     "--fiddler=lora", "--fdl.train.lora.rank=4", "--job_log_dir=job"])
  assert trained.code == 0, trained.stderr
  assert "new LoRA adapters over hf:" in trained.stdout
  for export_format in ("peft", "hf"):
    exported = run_cli(["--mode=export", "--job_log_dir=job", f"--export_format={export_format}",
                        f"--export_dir=out_{export_format}"])
    assert exported.code == 0, exported.stderr
  setup = _setup(f"hf:{base}", ("train.lora", fdl.Config(lora.LoraSettings, rank=4)))
  merged, unmerged = _ours(setup, tmp_path / "job")
  # To 1e-5 of the logits' scale: float32 rounds W + (alpha/r) A B once more than the apart
  # form computes (measured: 1.7e-5 absolute on logits of magnitude 3.2).
  scale = np.abs(unmerged).max()
  assert np.abs(merged - unmerged).max() < 1e-5 * scale
  reference = _torch_logits(peft.PeftModel.from_pretrained(_base(), "out_peft"))
  assert np.abs(unmerged - reference).max() < TOLERANCE
  assert np.abs(reference - _torch_logits(_base())).max() > 1e-3  # Three steps moved B.
  from_merged = transformers.LlamaForCausalLM.from_pretrained(
      "out_hf", dtype=torch.float32, attn_implementation="eager").eval()
  assert np.abs(_torch_logits(from_merged) - reference).max() < TOLERANCE
  # The merged export read back here: the same model, apart from float32 rounding.
  readback = _setup("hf:out_hf")
  with jax.default_matmul_precision("highest"):
    params, _ = JobParams(readback, epath.Path(tmp_path / "new_job")).load()
    again = np.asarray(jax.jit(readback.model.apply)({"params": params}, _tokens()))
  assert np.abs(again - unmerged).max() < 1e-5 * scale


@pytest.mark.parametrize("damage, message", [
    ("rank", "adapter_model.safetensors: tensor base_model.model.model.layers.0.self_attn."
             "q_proj.lora_A.weight has shape [4, 16], but this model's adapter "
             "layer_0/attention/query_kernel_lora_a [32, 4] needs [4, 32]"),
    ("module", "adapter of module 'model.layers.0.mlp.fc1', which this llama model has no "
               "kernel of its own for"),
])
def test_a_peft_folder_for_another_base_is_one_line(tmp_path, damage, message):
  """Adapters whose shapes, or modules, are not the base's: refused naming the tensor."""
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  folder = tmp_path / "adapter"
  shutil.copytree(FOLDERS["adapter"], folder)
  tensors = load_file(str(folder / "adapter_model.safetensors"))
  name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
  if damage == "rank":
    tensors[name] = tensors[name][:, :16].copy()
  else:
    tensors[name.replace("self_attn.q_proj", "mlp.fc1")] = tensors.pop(name)
  save_file(tensors, str(folder / "adapter_model.safetensors"))
  result = run_cli([f"--fdl_config=tests.weights.test_peft.config",
                    f"--init_from=peft:{folder},base=hf:{FOLDERS['base']}",
                    f"--job_log_dir={tmp_path / 'job'}"])
  assert result.code == 2, result.stderr
  assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
  assert not (tmp_path / "job").exists()


# ------------------------------------------------------------------ peft's options, adapters' lies

# Each LoraConfig option peft writes, with what lingvo_lite does with it: None where the
# adapters load (then compared with peft's own merge), else the words of the one-line refusal.
OPTIONS = {
    "layers_to_transform as a list, rank and alpha patterns that agree": (dict(
        target_modules=["q_proj", "v_proj"], layers_to_transform=[0],
        rank_pattern={"q_proj|v_proj": 2}, alpha_pattern={"q_proj|v_proj": 6}), None),
    "layers_to_transform as an index, layers_pattern, rsLoRA": (dict(
        target_modules=["q_proj", "down_proj"], layers_to_transform=1,
        layers_pattern="layers", use_rslora=True), None),
    "all-linear less exclude_modules": (dict(
        target_modules="all-linear", exclude_modules=["down_proj"]), None),
    "use_dora": (dict(target_modules=["q_proj"], use_dora=True),
                 "use_dora=True asks for DoRA"),
    "modules_to_save": (dict(target_modules=["q_proj"], modules_to_save=["lm_head"]),
                        "modules_to_save=['lm_head'] asks for modules trained whole"),
    "rank_pattern that differs": (dict(target_modules=["q_proj", "v_proj"],
                                       rank_pattern={"q_proj": 2}),
                                  "rank_pattern={'q_proj': 2} gives model.layers.0.self_attn."
                                  "q_proj 2 and model.layers.0.self_attn.v_proj 4"),
    "alpha_pattern that differs": (dict(target_modules=["q_proj", "v_proj"],
                                        alpha_pattern={"v_proj": 16}),
                                   "alpha_pattern={'v_proj': 16} gives"),
}


def _peft_folder(folder, **options):
  """Adapters peft makes over the base with `options` (r 4, alpha 8 unless they say), A and B
  random; their folder."""
  generator = torch.Generator().manual_seed(2)
  adapted = peft.get_peft_model(_base(), peft.LoraConfig(
      **{"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, **options}))
  with torch.no_grad():
    for name, parameter in adapted.named_parameters():
      if "lora_" in name:
        parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
  adapted.save_pretrained(folder)
  return folder


def _merged(checkpoint, model, base_params):
  """The base's tensors with `checkpoint`'s adapters merged as train.lora says (lora.merge),
  by Hugging Face name."""
  from lingvo_lite.checkpoints.params import MeshParams  # pylint: disable=g-import-not-at-top
  from lingvo_lite.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights.hf_export import NamedTensors  # pylint: disable=g-import-not-at-top
  settings = checkpoint.lora_settings(model)
  partitioner = Partitioner()
  adapted = MeshParams(model.with_adapters(settings), 16, partitioner,
                       partitioner.make_mesh(), collection=lora.COLLECTION)
  adapters, _ = checkpoint.load_adapters(adapted)
  merged = jax.tree.map(np.asarray, lora.merge(base_params, adapters, settings.scale))
  named = NamedTensors(model, merged)
  return {name: np.asarray(named[name]) for name in named}


def test_every_option_peft_writes_loads_as_peft_merges_it_or_is_one_line(tmp_path):
  """Adapters peft made with each LoraConfig option it writes: where lingvo_lite reads them,
  the base with the adapters merged is peft's own `merge_and_unload()` (to float32 rounding);
  else one line naming the key and the fix."""
  from lingvo_lite.errors import UsageError  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights.hf_checkpoint import HfCheckpoint  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights.peft import PeftCheckpoint  # pylint: disable=g-import-not-at-top
  base = HfCheckpoint(str(FOLDERS["base"]))
  family, fields = base.model_fields()
  model = family(**fields)
  base_params = None
  for name, (options, refusal) in OPTIONS.items():
    folder = _peft_folder(tmp_path / name.replace(" ", "_"), **options)
    checkpoint = PeftCheckpoint(str(folder), base=base)
    if refusal is not None:
      with pytest.raises(UsageError) as error:
        checkpoint.lora_settings(model)
      assert refusal in str(error.value) and "\n" not in str(error.value), (name, error.value)
      assert "merge_and_unload" in str(error.value), error.value
      continue
    if base_params is None:
      from lingvo_lite.checkpoints.params import MeshParams  # pylint: disable=g-import-not-at-top
      from lingvo_lite.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
      partitioner = Partitioner()
      base_params = jax.tree.map(np.asarray, base.load_params(MeshParams(
          model, 16, partitioner, partitioner.make_mesh()))[0])
    ours = _merged(checkpoint, model, base_params)
    if options.get("layers_to_transform") == [0]:  # Some layers only: a scan adapts all.
      with pytest.raises(UsageError) as error:
        lora.check_targets(checkpoint.lora_settings(model), model.clone(scan_layers=True), 1)
      assert "set --fdl.model.scan_layers=False" in str(error.value), error.value
    theirs = {key: value.numpy() for key, value in peft.PeftModel.from_pretrained(
        _base(), str(folder)).merge_and_unload().state_dict().items()}
    before = _base().state_dict()
    assert set(ours) <= set(theirs), name
    assert any(np.abs(theirs[key] - before[key].numpy()).max() > 0.1 for key in ours), name
    for key in ours:  # W + s B A summed in another order: two float32 ulps of |W| <= 4.
      np.testing.assert_allclose(ours[key], theirs[key], rtol=0, atol=1e-6, err_msg=name)


Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = Q_A.replace("lora_A", "lora_B")
# Edits of the fixture's adapter file -> the words of the one-line refusal, or of the one
# warning line ("warning", words) where the adapters still load (None: they load in silence).
LIES = {
    "an int32 lora_A": (lambda t: {**t, Q_A: t[Q_A].astype(np.int32)},
                        f"tensor {Q_A} is int32, not floating point, where the model reads the "
                        "float weight adapter layer_0/attention/query_kernel_lora_a [32, 4]"),
    "a bool lora_B": (lambda t: {**t, Q_B: t[Q_B] > 0},
                      f"tensor {Q_B} is bool, not floating point"),
    "a lora_A of another rank": (lambda t: {**t, Q_A: t[Q_A][:2]},
                                 f"tensor {Q_A} has shape [2, 32], but this model's adapter "
                                 "layer_0/attention/query_kernel_lora_a [32, 4] needs [4, 32]"),
    "no lora_B of a targeted module": (lambda t: {k: v for k, v in t.items() if k != Q_B},
                                       f"no tensor {Q_B}, which this model needs"),
    "an adapter of a module the base lacks": (
        lambda t: {**t, Q_A.replace("self_attn.q_proj", "mlp.fc1"): t[Q_A]},
        "adapter of module 'model.layers.0.mlp.fc1', which this llama model has no kernel of "
        "its own for"),
    "adapters of a module the config does not target, a tensor of no adapter": (
        lambda t: {**t, Q_A.replace("q_proj", "k_proj"): t[Q_A], "notes.scale": t[Q_A][0]},
        ("warning", "peft_lies/adapter_model.safetensors: 2 tensors that no part of the model "
         f"reads, left unread: {Q_A.replace('q_proj', 'k_proj')}, notes.scale")),
    "a float16 lora_A": (lambda t: {**t, Q_A: t[Q_A].astype(np.float16)}, None),
}


def test_adapter_files_get_the_checks_weights_get(tmp_path, capsys):
  """Each adapter is a float of the shape the base's kernel and the rank need, and there;
  what no adapter reads is named in one warning; float widths convert value for value."""
  import shutil  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  from lingvo_lite.checkpoints.params import MeshParams  # pylint: disable=g-import-not-at-top
  from lingvo_lite.errors import UsageError  # pylint: disable=g-import-not-at-top
  from lingvo_lite.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights.hf_checkpoint import HfCheckpoint  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights.peft import PeftCheckpoint  # pylint: disable=g-import-not-at-top
  base = HfCheckpoint(str(FOLDERS["base"]))
  family, fields = base.model_fields()
  model = family(**fields)
  settings = PeftCheckpoint(str(FOLDERS["adapter"]), base=base).lora_settings(model)
  partitioner = Partitioner()
  adapted = MeshParams(model.with_adapters(settings), 16, partitioner, partitioner.make_mesh(),
                       collection=lora.COLLECTION)
  held = load_file(str(FOLDERS["adapter"] / "adapter_model.safetensors"))
  for name, (edit, words) in LIES.items():
    folder = tmp_path / "peft_lies"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(FOLDERS["adapter"], folder)
    save_file(edit(dict(held)), str(folder / "adapter_model.safetensors"))
    checkpoint = PeftCheckpoint(str(folder), base=base)
    capsys.readouterr()
    if words is None or isinstance(words, tuple):
      adapters, _ = checkpoint.load_adapters(adapted)
      err = capsys.readouterr().err
      if words is None:
        assert err == "", (name, err)
      else:
        assert f"lingvo_lite: warning: " in err and words[1] in err, (name, err)
        assert err.count("\n") == 1, err
      a = np.asarray(lora.flatten(adapters)["layer_0/attention/query_kernel" + lora.A_SUFFIX])
      np.testing.assert_array_equal(a, edit(dict(held))[Q_A].astype(np.float32).T)
      continue
    with pytest.raises(UsageError) as error:
      checkpoint.load_adapters(adapted)
    message = str(error.value)
    assert words in message and "\n" not in message and "peft_lies/" in message, (name, message)
