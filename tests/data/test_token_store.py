"""The token store: built by the Beam pipeline from a seqio Task, read back packed, exactly.

Every test builds real stores (the Beam DirectRunner, in process) over a small folder of .py
files with the byte vocabulary, so token ids are bytes + 3 and EOS is 1: the expected corpus
is known without the pipeline.
"""

import collections
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite.data import packing, store_build, token_store
from lingvo_lite.data.permutation import KeyedPermutation
from lingvo_lite.data.prefetch import Prefetcher
from lingvo_lite.data.store_data import StoreStream, TokenStoreData, TokenStoreMixture
from lingvo_lite.errors import DataError, UsageError
from lingvo_lite.models.transformer import TransformerLM
from tasks import pycode

LENGTH = 64
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # Of the imports below.


def write_corpus(folder, count=12, seed=0):
  """`count` .py files: some shorter than an example, some longer than several."""
  rng = np.random.default_rng(seed)
  folder.mkdir(parents=True, exist_ok=True)
  for i in range(count):
    lines = 0 if i % 2 else rng.integers(1, 40 if i % 5 else 200)
    body = f"x{i} = {i}\n" + "".join(f"def f{i}_{j}(x):\n    return x * {j}  # é\n"
                                   for j in range(lines))
    (folder / f"m{i:02d}.py").write_text(body)
  return folder


def corpus_tokens(root, split):
  """What the store must hold: each file's bytes + 3, then EOS (1)."""
  return [np.frombuffer(d, np.uint8).astype(np.int64) + 3 for d in
          pycode.read_documents(str(root), split)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return write_corpus(tmp_path_factory.mktemp("corpus"))


def data(root, store_root, split="train", **fields):
  fields.setdefault("global_batch_size", 4)
  return TokenStoreData(task=pycode.pycode_task(str(root)), split=split,
                        sequence_length=LENGTH, store_dir=str(store_root / split),
                        build_workers=1, **fields)


def test_keyed_permutation_is_a_bijection_without_materializing():
  for size in (1, 2, 3, 7, 64, 1000, 4099):
    image = KeyedPermutation(size, 5, 0)(np.arange(size))
    assert sorted(image.tolist()) == list(range(size))
  first = KeyedPermutation(1000, 5, 0)(np.arange(1000))
  assert (first != KeyedPermutation(1000, 5, 1)(np.arange(1000))).mean() > 0.9  # epochs
  assert (first == KeyedPermutation(1000, 5, 0)(np.arange(1000))).all()  # deterministic
  huge = KeyedPermutation(10**12, 1, 2)(np.arange(10**12 - 5000, 10**12))  # no O(n) table
  assert len(set(huge.tolist())) == 5000 and huge.min() >= 0 and huge.max() < 10**12


def test_packed_batch_segments_positions_and_shifted_inputs():
  tokens = np.array([[10, 11, 1, 20, 21, 22, 1, 0]], np.int32)
  starts = np.array([[1, 0, 0, 1, 0, 0, 0, 0]], bool)
  batch = packing.packed_batch(tokens, np.ones((1, 8), np.float32), starts, np.array([7]))
  assert batch["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 2, 2, 0]]
  assert batch["positions"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0]]
  assert batch["inputs"].tolist() == [[0, 10, 11, 0, 20, 21, 22, 0]]
  assert batch["weights"].tolist() == [[1, 1, 1, 1, 1, 1, 1, 0]]


def test_one_epoch_returns_every_token_once(corpus, tmp_path):
  source = data(corpus, tmp_path, shuffle=True, global_batch_size=1)
  expected = np.concatenate([np.append(d, 1) for d in corpus_tokens(corpus, "train")])
  count = source.num_examples(LENGTH)
  assert count == -(-len(expected) // LENGTH)
  rows = source.windows(np.arange(count), LENGTH)
  out = rows["targets"][rows["weights"] > 0]
  assert rows["weights"].sum() == len(expected)  # tokens out == tokens in
  assert collections.Counter(out.tolist()) == collections.Counter(expected.tolist())
  # Unshuffled, the windows are the stream itself, cut every LENGTH tokens.
  plain = data(corpus, tmp_path, shuffle=False)
  ordered = plain.windows(np.arange(count), LENGTH)
  assert np.array_equal(ordered["targets"][ordered["weights"] > 0], expected)
  # A long document is split into chunks, each its own segment starting at position 0.
  assert (ordered["positions"][:, 0] == 0).all()
  manifest = token_store.read_manifest(plain.path)
  assert manifest["tokens"] == len(expected) and manifest["dtype"] == "uint16"
  assert manifest["documents"] == len(corpus_tokens(corpus, "train"))


def test_packed_logits_equal_each_document_run_alone(corpus, tmp_path):
  source = data(corpus, tmp_path, shuffle=False)
  batch = source.windows(np.arange(source.num_examples(LENGTH)), LENGTH)
  model = TransformerLM(vocab_size=259, num_layers=2, dim=32, num_heads=2, mlp_dim=64,
                        dtype="float32", position="rotary", rotary_dim=8)
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, LENGTH), jnp.int32))
  # One compiled program for all the documents: each runs alone in a row of its own, from
  # position 0, padded after its end to the row length. Attention is causal (test_transformer
  # checks that), so what comes after a token cannot change its logits; running each document
  # at its own length instead compiled a program per length (over two minutes on 2 cores).
  apply = jax.jit(model.apply)
  packed = np.asarray(apply(params, batch["inputs"], batch["segment_ids"], batch["positions"]))
  documents, rows = [], []
  for row in range(len(batch["inputs"])):
    for segment in set(batch["segment_ids"][row].tolist()) - {0}:
      where = np.flatnonzero(batch["segment_ids"][row] == segment)
      alone = np.zeros(LENGTH, batch["inputs"].dtype)
      alone[:len(where)] = batch["inputs"][row, where]
      documents.append((row, where))
      rows.append(alone)
  alone = np.asarray(apply(params, np.stack(rows)))
  for index, (row, where) in enumerate(documents):
    np.testing.assert_allclose(packed[row, where], alone[index, :len(where)], atol=1e-5,
                               rtol=1e-5)
  assert len(documents) > len(batch["inputs"]) + 4  # Some windows hold several documents.


def batch_hash(batch):
  digest = hashlib.sha256()
  for key in sorted(batch):
    digest.update(key.encode() + np.ascontiguousarray(batch[key]).tobytes())
  return digest.hexdigest()


def test_global_batches_do_not_depend_on_the_process_count(corpus, tmp_path):
  source = data(corpus, tmp_path, global_batch_size=8)
  for step in (0, 1, 7, 50):  # 50 is past the first epoch: a fresh permutation.
    whole = source.batch(step, 0, 1)
    halves = [source.batch(step, index, 2) for index in range(2)]
    joined = {key: np.concatenate([h[key] for h in halves]) for key in whole}
    assert batch_hash(joined) == batch_hash(whole)
  assert batch_hash(source.batch(0)) != batch_hash(source.batch(1))


def test_changed_source_files_are_never_read_from_a_stale_store(tmp_path):
  root = write_corpus(tmp_path / "corpus", count=4)
  source = data(root, tmp_path / "stores")
  source.check()
  (root / "m01.py").write_text("def changed():\n    pass\n")
  with pytest.raises(UsageError, match=r"store_dir=.*: the store is stale: source file "
                     r".*m01\.py changed.*set build=True"):
    data(root, tmp_path / "stores", build=False).check()
  rebuilt = data(root, tmp_path / "stores")  # build=True rebuilds it.
  rebuilt.check()
  expected = sum(len(d) + 1 for d in corpus_tokens(root, "train"))
  assert token_store.read_manifest(rebuilt.path)["tokens"] == expected
  with pytest.raises(UsageError, match=r"store_dir=.*holds no token store"):
    data(root, tmp_path / "nowhere", build=False).check()


def test_a_failed_build_leaves_no_store_that_looks_complete(tmp_path, monkeypatch):
  root = write_corpus(tmp_path / "corpus", count=6)
  real = token_store.write_shard

  def fail_on_third(store, index, *args, **kwargs):
    if index == 2:
      raise DataError(f"{root}/m02.py: record 0: injected failure")
    return real(store, index, *args, **kwargs)

  monkeypatch.setattr(token_store, "write_shard", fail_on_third)
  monkeypatch.setattr(store_build, "GROUP_BYTES", 1)  # A shard per file: several shards.
  source = data(root, tmp_path / "stores")
  with pytest.raises(DataError, match=r"m02\.py: record 0: injected failure"):
    source.check()
  assert not source.path.exists()
  # Nor its partial store, lock file, log, or the folder the build made for them.
  assert not source.path.parent.exists()


def build_script(root, store, before="", after=""):
  """A child process's program: build the corpus at `root` into `store` (`manifest`), with
  `before` and `after` run around the build."""
  return (f"import sys; sys.path.insert(0, {ROOT!r})\n"
          "from etils import epath\n"
          "from lingvo_lite.data import store_build, token_store\n"
          "from tasks import pycode\n" + before +
          f"manifest = store_build.build_store(pycode.pycode_task({str(root)!r}), 'train', "
          f"epath.Path({str(store)!r}), workers=1, progress=False)\n" + after)


def test_a_killed_build_is_not_mistaken_for_a_store(tmp_path):
  root = write_corpus(tmp_path / "corpus", count=40)
  store = tmp_path / "stores" / "train"
  script = build_script(root, store, before=(
      "import time\n"
      "real = token_store.write_shard\n"
      "def slow(*a, **k):\n  time.sleep(0.3); return real(*a, **k)\n"
      "token_store.write_shard = slow\n"
      "store_build.GROUP_BYTES = 1\n"))  # A shard per file: a build long enough to kill.
  child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.DEVNULL)
  deadline = time.time() + 120
  while time.time() < deadline and not list(store.parent.glob(".train.partial-*/ledger/*")):
    time.sleep(0.2)
  child.send_signal(signal.SIGKILL)
  child.wait()
  assert list(store.parent.glob(".train.partial-*/ledger/*")), "the build never started"
  assert token_store.read_manifest(store) is None
  with pytest.raises(UsageError, match="holds no token store"):
    data(root, tmp_path / "stores", build=False).check()
  data(root, tmp_path / "stores").check()  # The next run builds it whole...
  assert token_store.read_manifest(store)["documents"] == len(corpus_tokens(root, "train"))
  assert not list(store.parent.glob(".train.partial-*"))  # ...and clears the dead one.


def test_mixture_rates_and_exact_resume(tmp_path):
  first = write_corpus(tmp_path / "a", count=5, seed=1)
  second = write_corpus(tmp_path / "b", count=5, seed=2)
  sources = [StoreStream(task=pycode.pycode_task(str(r)), split="train",
                         store_dir=str(tmp_path / "stores" / r.name), build_workers=1)
             for r in (first, second)]
  mixture = TokenStoreMixture(sources=sources, rates=[0.7, 0.3], sequence_length=LENGTH,
                              global_batch_size=10, seed=3)
  which, position = mixture.assign(np.arange(10_000))
  assert abs((which == 0).mean() - 0.7) < 0.02 and abs((which == 1).mean() - 0.3) < 0.02
  # Each source walks its own stream: positions 0, 1, 2, ... each visited once.
  for index in (0, 1):
    assert sorted(position[which == index].tolist()) == list(range((which == index).sum()))
  again_which, again_position = mixture.assign(np.arange(5_000, 10_000))
  assert (again_which == which[5_000:]).all() and (again_position == position[5_000:]).all()
  batch = mixture.batch(3)
  halves = [mixture.batch(3, i, 2) for i in range(2)]
  assert batch_hash(batch) == batch_hash({k: np.concatenate([h[k] for h in halves])
                                          for k in batch})
  with pytest.raises(UsageError, match=r"rates\[1\]=-1: must be a positive number"):
    TokenStoreMixture(sources=sources, rates=[1, -1], sequence_length=LENGTH,
                      global_batch_size=10)


def test_unreadable_shard_surfaces_in_the_main_thread_with_file_and_example(tmp_path):
  root = write_corpus(tmp_path / "corpus", count=3)
  source = data(root, tmp_path / "stores", shuffle=False)
  source.check()
  for chunk in (source.path / "shards").glob("*/tokens/0"):
    chunk.write_bytes(b"short")
  prefetcher = Prefetcher(source, 0, 5)
  with pytest.raises(DataError, match=r"shards/0000\d: unreadable tokens .*examples \[0, 1, "):
    list(prefetcher)
  prefetcher.close()


RSS_SCRIPT = """
import resource, sys, numpy as np
sys.path.insert(0, sys.argv[2])
from etils import epath
from lingvo_lite.data import token_store, packing
store = token_store.open_store(epath.Path(sys.argv[1]))
def rss_mb():
  with open("/proc/self/status") as f:
    return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
rng = np.random.default_rng(0)
examples = store.num_tokens // 128
store.read(rng.integers(0, examples, 64) * 128, 128)
before = rss_mb()
for _ in range(300):
  packing.packed_batch(*store.read(rng.integers(0, examples, 64) * 128, 128))
print(rss_mb() - before)
"""


def write_synthetic_store(path, tokens, shards):
  rng = np.random.default_rng(0)
  per_shard = tokens // shards
  for index in range(shards):
    lengths = rng.integers(100, 4000, per_shard // 100)
    stream = rng.integers(3, 259, per_shard).astype(np.uint16)
    cuts = np.cumsum(lengths)
    documents = np.split(stream, cuts[cuts < per_shard])
    token_store.write_shard(path, index, documents, None, np.dtype(np.uint16), {"files": 1})
  ledger = token_store.read_ledger(path)
  manifest = {"schema": token_store.SCHEMA, "has_weights": False,
              "shards": [ledger[i] for i in range(shards)]}
  (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
def test_loader_memory_does_not_grow_with_the_store(tmp_path):
  growth = {}
  for name, tokens in (("small", 4_000_000), ("large", 40_000_000)):
    path = tmp_path / name
    write_synthetic_store(path, tokens, shards=8)
    # Two malloc arenas: glibc gives each of tensorstore's reader threads its own arena, and
    # how many of them a run touches varies with the machine's load (the large store measured
    # 11-28 MB over 4 runs under a parallel suite, 6-10 MB with two arenas; the small one 6-7
    # either way): noise that does not grow with the store and would hide what does.
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(path), ROOT],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "MALLOC_ARENA_MAX": "2"})
    growth[name] = float(out.stdout.strip().splitlines()[-1])
  print(f"loader RSS growth over 300 batches: {growth} MB")
  assert growth["large"] < 50  # The bound the README states.
  assert growth["large"] < growth["small"] + 20


def test_pretokenized_tfrecords_and_prompt_completion_weights_go_through_the_store(tmp_path):
  from lingvo_lite.runtime.tensorflow_import import import_tensorflow
  from tasks.formats import prompt_completion, tfrecord
  tf = import_tensorflow()
  documents = [[5, 6, 7, 9], [8, 9], list(range(3, 100))]
  with tf.io.TFRecordWriter(str(tmp_path / "tokens.tfrecords")) as writer:
    for ids in documents:
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          "text": tf.train.Feature(int64_list=tf.train.Int64List(value=ids))})
                                    ).SerializeToString())
  tokens = TokenStoreData(task=tfrecord.pretokenized_tfrecord_task(
      {"train": str(tmp_path / "*.tfrecords")}, vocab_size=128), split="train",
                          sequence_length=LENGTH, global_batch_size=1, shuffle=False,
                          store_dir=str(tmp_path / "stores" / "tokens"), build_workers=1)
  windows = tokens.windows(np.arange(tokens.num_examples(LENGTH)), LENGTH)
  assert windows["targets"][windows["weights"] > 0].tolist() == sum(documents, [])
  assert tokens.token_bytes is None  # Ids without text: eval reports bits per token only.

  (tmp_path / "pairs.jsonl").write_text(
      json.dumps({"prompt": "Q: 2+2?", "completion": " 4"}) + "\n"
      + json.dumps({"prompt": "Q: hi", "completion": " hello"}) + "\n")
  pairs = TokenStoreData(task=prompt_completion.prompt_completion_task(
      {"train": str(tmp_path / "pairs.jsonl")}), split="train", sequence_length=LENGTH,
                         global_batch_size=1, shuffle=False,
                         store_dir=str(tmp_path / "stores" / "pairs"), build_workers=1)
  batch = pairs.windows(np.arange(1), LENGTH)
  scored = batch["targets"][0][batch["weights"][0] > 0]
  assert scored.tolist() == [b + 3 for b in b" 4"] + [1] + [b + 3 for b in b" hello"] + [1]
  assert batch["segment_ids"][0].max() == 2
  assert token_store.read_manifest(pairs.path)["has_weights"]


@pytest.mark.slow
def test_two_concurrent_builds_of_one_store_build_it_once(tmp_path):
  root = write_corpus(tmp_path / "corpus", count=8)
  store = tmp_path / "stores" / "train"
  script = build_script(root, store, after="print(manifest['build']['at'], "
                                            "manifest['build']['seconds'])\n")
  children = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True) for _ in range(2)]
  outputs = [child.communicate(timeout=240)[0] for child in children]
  assert [child.returncode for child in children] == [0, 0]
  assert outputs[0] == outputs[1]  # The second waited on the lock and took the first's store.
  assert token_store.read_manifest(store)["documents"] == len(corpus_tokens(root, "train"))
  assert not list(store.parent.glob(".train.partial-*"))
