"""Chat and preference data (tasks/formats/chat.py, preference.py; lingvo_lite/data/
chat_template.py, preference_data.py): the loss mask equals a hand-marked conversation for
SmolLM2's own template and a Llama-3-style one; conversations it cannot be made for are refused
in one line; bad records are counted with --skip_bad_records (without it a bad record is one
line naming the file and the line: tests/test_bin_tools_bad_input.py's table); and preference
pairs are packed whole, each in one row. An answer begun (lm_eval's gen_prefix) is left open.

The stores build in this process (bin/build_store.py's main)."""

import json
import re

import numpy as np
import pytest
from etils import epath

from experiments.lm.smollm2 import smollm2_gguf
from lingvo_lite.data import chat_template, pretrained_tokenizer, token_store
from lingvo_lite.data.preference_data import PreferenceStoreData
from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer
from tasks.formats.preference import preference_task
from tests import bin_tools
from tests.data import chat_tokenizers

OPEN, CLOSE = "\u27e6", "\u27e7"  # Around the tokens that count.


def _marked(files, messages) -> str:
  """The conversation's tokens as text, every run of weighted tokens between OPEN and CLOSE."""
  ids, weights = chat_template.conversation_tokens(files, messages)
  made = pretrained_tokenizer.tokenizer(files)
  text, inside = "", False
  for token, weight in zip(ids, weights):
    if bool(weight) != inside:
      text += OPEN if weight else CLOSE
      inside = bool(weight)
    text += made.decode([int(token)], skip_special_tokens=False)
  return text + (CLOSE if inside else "")


CONVERSATION = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "It is 4."},
                {"role": "user", "content": "And 3+3?"},
                {"role": "assistant", "content": "6"}]


def test_smollm2_templates_loss_mask_is_the_hand_marked_one():
  files = pretrained_tokenizer.read(smollm2_gguf())
  assert _marked(files, CONVERSATION) == (
      "<|im_start|>system\nBe brief.<|im_end|>\n"
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
      f"<|im_start|>assistant\n{OPEN}It is 4.<|im_end|>{CLOSE}\n"
      "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
      f"<|im_start|>assistant\n{OPEN}6<|im_end|>{CLOSE}\n")
  # Without a system message the template adds its own; the mask follows the assistant still.
  alone = _marked(files, CONVERSATION[1:3])
  assert alone.endswith(f"<|im_start|>assistant\n{OPEN}It is 4.<|im_end|>{CLOSE}\n")
  assert "SmolLM" in alone


def test_llama3_style_templates_loss_mask_is_the_hand_marked_one(tmp_path):
  files = pretrained_tokenizer.read(chat_tokenizers.byte_level_folder(tmp_path, "llama3"))
  assert _marked(files, CONVERSATION) == (
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
      f"<|start_header_id|>assistant<|end_header_id|>\n\n{OPEN}It is 4.<|eot_id|>{CLOSE}"
      "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"
      f"<|start_header_id|>assistant<|end_header_id|>\n\n{OPEN}6<|eot_id|>{CLOSE}")


@pytest.mark.parametrize("template, begun", [
    ("chatml", "<|im_start|>assistant\n```python\ndef f():\n"),
    ("llama3", "<|start_header_id|>assistant<|end_header_id|>\n\n```python\ndef f():"),
])
def test_an_answer_begun_is_left_open_as_transformers_continues_it(tmp_path, template, begun):
  """lm_eval's gen_prefix (an assistant message left open, transformers'
  `continue_final_message`): the conversation ends inside the answer, after its text; a
  template that trims the content (Llama 3's) loses the trailing line break."""
  folder = chat_tokenizers.byte_level_folder(tmp_path, template)
  files = pretrained_tokenizer.read(folder)
  messages = [*CONVERSATION[1:3], {"role": "user", "content": "Write f."}]
  rendered = chat_template.render_continuing(
      files, [*messages, {"role": "assistant", "content": "```python\ndef f():\n"}])
  closed = chat_template.render_with(files, messages, add_generation_prompt=False)
  assert rendered.startswith(closed) and rendered[len(closed):] == begun


# A template that numbers the conversation's length at its start: no prefix of a conversation
# renders as a prefix of the whole.
COUNTING = ("{{ messages|length }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
            "{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NO_SYSTEM = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
             "supported') }}{% endif %}" + chat_tokenizers.SMOLLM2_TEMPLATE)


@pytest.mark.parametrize("template, messages, reason", [
    (None, [{"role": "user", "content": "hi"}],
     "has no assistant message (nothing to train on)"),
    (None, [{"role": "robot", "content": "hi"}], "message 0 has role 'robot'"),
    (None, "hi", "'messages' is not a non-empty list of messages"),
    (COUNTING, CONVERSATION[1:3], "the chat template renders the conversation before message 1 "
     "(the assistant's) as text that is not a prefix of the whole conversation's"),
    (NO_SYSTEM, CONVERSATION, "the chat template refuses them: System role not supported"),
])
def test_conversations_the_mask_cannot_be_made_for_are_refused(tmp_path, template, messages,
                                                               reason):
  files = pretrained_tokenizer.read(chat_tokenizers.byte_level_folder(tmp_path))
  if template is not None:
    files = dataclasses_replace(files, chat_template=template)
  with pytest.raises(chat_template.ConversationError) as raised:
    chat_template.conversation_tokens(files, chat_template.checked_messages(messages))
  assert reason in str(raised.value) and "\n" not in str(raised.value)


def dataclasses_replace(files, **changes):
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(files, **changes)


def _pairs(count):
  """Pairs of one length (a byte-level tokenizer: one token a byte), so three fill a row."""
  return [{"prompt": f"Add {i:02d} and {i + 1:02d}.", "chosen": f"{2 * i + 1:03d}",
           "rejected": f"{2 * i + 2:03d}"} for i in range(count)]


def test_bad_records_are_counted_with_skip_and_pairs_pack_whole(tmp_path, capfd, monkeypatch):
  """A store of conversations with bad records (no assistant, not JSON, not an object): built
  with --skip_bad_records, the summary counts them and names the first; the documents carry
  the mask. A preference store's rows hold whole pairs, chosen then rejected, every pair once
  an epoch."""
  monkeypatch.chdir(tmp_path)
  tokenizer = chat_tokenizers.byte_level_folder(tmp_path / "tok")
  good = {"messages": CONVERSATION[1:3]}
  lines = [json.dumps(good), json.dumps({"messages": CONVERSATION[1:2]}), "{oops",
           json.dumps([1]), json.dumps(good)]
  (tmp_path / "chat.jsonl").write_text("\n".join(lines) + "\n")
  main = bin_tools.tool("build_store").main
  code = main(["--format=chat", "--files=train=chat.jsonl", "--vocabulary=tokenizer:tok",
               "--out=chat", "--skip_bad_records", "--no_progress"])
  out, err = capfd.readouterr()
  assert code == 0, err
  assert ("2 documents" in out and "3 bad records skipped (--skip_bad_records; the first: "
          f"{tmp_path}/chat.jsonl: line 2: has no assistant message (nothing to train on))"
          in out), out
  store = token_store.open_store(epath.Path(tmp_path / "chat" / "train"))
  files = pretrained_tokenizer.read("tok")
  ids, weights = chat_template.conversation_tokens(files, CONVERSATION[1:3])
  tokens, stored, _, _ = store.read(np.array([0]), len(ids))
  np.testing.assert_array_equal(tokens[0], ids)
  np.testing.assert_array_equal(stored[0], weights)

  (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in _pairs(12)))
  task = preference_task({"train": "pairs.jsonl"}, PretrainedTokenizer("tok"))
  lengths = []
  for pair in _pairs(12):
    for side in ("chosen", "rejected"):
      messages = chat_template.checked_messages(
          [{"role": "user", "content": pair["prompt"]},
           {"role": "assistant", "content": pair[side]}])
      lengths.append(chat_template.conversation_tokens(files, messages))
  row = sum(len(ids) for ids, _ in lengths[:6]) + 3  # Three pairs fit; a fourth does not.
  source = PreferenceStoreData(task=task, split="train", store_dir="pairs", sequence_length=row,
                               global_batch_size=2, shuffle=True, seed=3)
  source.check()
  assert source.examples_per_pass() == 4
  seen = []
  for step in range(2):  # One epoch: 4 rows.
    batch = source.batch(step)
    for r in range(2):
      segments = batch["segment_ids"][r]
      count = segments.max()
      assert count % 2 == 0 and count > 0
      for s in range(1, count + 1, 2):
        chosen, rejected = (batch["targets"][r][segments == s],
                            batch["targets"][r][segments == s + 1])
        index = [i for i in range(12) if np.array_equal(lengths[2 * i][0], chosen)]
        assert len(index) == 1 and np.array_equal(lengths[2 * index[0] + 1][0], rejected)
        np.testing.assert_array_equal(batch["weights"][r][segments == s],
                                      lengths[2 * index[0]][1])
        seen.append(index[0])
  assert sorted(seen) == list(range(12))


# Pairs with nothing to learn: the same answer twice, and two answers that differ only where
# Llama 3's template does not look (it trims the content).
_GOOD_PAIRS = [{"prompt": f"Add {i} and {i}.", "chosen": str(2 * i), "rejected": str(2 * i + 1)}
               for i in range(3)]
_EQUAL_PAIRS = [{"prompt": "Say 42.", "chosen": "42", "rejected": "42"},
                {"prompt": "Say 7.", "chosen": "7", "rejected": [{"role": "assistant",
                                                                  "content": " 7 \n"}]}]
_SAME_TOKENS = "'chosen' and 'rejected' are the same tokens once templated"
_EQUAL_CASES = {
    # name: (format, records, --skip_bad_records, exit code, stdout has, stderr has).
    "some equal: built, one warning line": (
        "preference", _GOOD_PAIRS + _EQUAL_PAIRS, False, 0, "10 documents",
        "build_store: warning: train: 2 of 5 preference pairs have 'chosen' equal to 'rejected' "
        "once templated and tokenized; DPO learns nothing from them (--skip_bad_records drops "
        "them)\n"),
    "some equal, skipped: dropped as bad records": (
        "preference", _GOOD_PAIRS + _EQUAL_PAIRS, True, 0,
        f"6 documents, .* 2 bad records skipped \\(--skip_bad_records; the first: .*pairs.jsonl: "
        f"line 4: {_SAME_TOKENS}", ""),
    "all equal: refused": (
        "preference", _EQUAL_PAIRS, False, 2, "",
        "split 'train': every one of its 2 preference pairs has 'chosen' equal to 'rejected' "
        "once templated and tokenized, so DPO learns nothing from them; give pairs whose answers "
        "differ\n"),
    "all equal, skipped: every record bad": (
        "preference", _EQUAL_PAIRS, True, 2, "",
        "split 'train': every record is bad: 2 bad records skipped (--skip_bad_records; the "
        f"first: {{tmp}}/pairs.jsonl: line 1: {_SAME_TOKENS} (DPO learns nothing from the "
        "pair)); fix the records"),
    "every chat record bad, skipped": (
        "chat", [{"messages": [{"role": "user", "content": "hi"}]}, [1]], True, 2, "",
        "split 'train': every record is bad: 2 bad records skipped (--skip_bad_records; the "
        "first: {tmp}/pairs.jsonl: line 1: has no assistant message"),
}


@pytest.mark.parametrize("name", list(_EQUAL_CASES))
def test_pairs_with_nothing_to_learn_are_counted_dropped_or_refused(name, tmp_path, capfd,
                                                                     monkeypatch, caplog):
  """A pair whose sides template to the same tokens: counted with a warning line, dropped as a
  bad record with --skip_bad_records, and a split of nothing else refused in one line, exit 2
  (as is a split whose every record was skipped, whatever the format). A preference source
  over the store warns of them too."""
  kind, records, skip, code, out_has, err_has = _EQUAL_CASES[name]
  monkeypatch.chdir(tmp_path)
  # What the tool sets for itself when run: its TensorFlow neither probes for a GPU nor logs.
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
  chat_tokenizers.byte_level_folder(tmp_path / "tok", template="llama3")
  (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  got = bin_tools.tool("build_store").main([f"--format={kind}", "--files=train=pairs.jsonl",
                             "--vocabulary=tokenizer:tok", "--out=pairs", "--no_progress",
                             *["--skip_bad_records"] * skip])
  out, err = capfd.readouterr()
  assert got == code, err
  assert re.search(out_has, out) if out_has else not out, out
  if code:
    assert err.startswith("build_store: ") and err.count("\n") == 1, err
    assert err_has.format(tmp=tmp_path) in err, err
    assert not (tmp_path / "pairs").exists()
    return
  assert err == err_has
  manifest = token_store.read_manifest(epath.Path(tmp_path / "pairs" / "train"))
  assert manifest["equal_pairs"] == (0 if skip else 2)
  task = preference_task({"train": "pairs.jsonl"}, PretrainedTokenizer("tok"),
                         skip_bad_records=skip)
  PreferenceStoreData(task=task, split="train", store_dir="pairs/train",
                      sequence_length=512, global_batch_size=1).check()
  warned = [r.getMessage() for r in caplog.records if "preference pairs have" in r.getMessage()]
  assert warned == ([] if skip else [f"{task.name}/train: " + err_has[len(
      "build_store: warning: train: "):-1]])
