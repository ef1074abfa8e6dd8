"""Tokenizers and chat templates as transformers has them, and the fine-tuning data built on
them: ids equal AutoTokenizer's, chats render as apply_chat_template renders them, assistant
labels equal transformers' assistant mask; bad data is refused naming the line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from burn_remote import text_data
from burn_remote.tokenizer import ChatTemplateError, Tokenizer

from tests.hf.tokenizer_dir import CHATML, make_tokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("jinja2")

CHATS = [
    [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "What does the server cache?"},
        {"role": "assistant", "content": "Graphs, by their hash."},
        {"role": "user", "content": "And replays them?"},
        {"role": "assistant", "content": "Yes: only bindings travel."},
    ],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}],
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def test_ids_and_chats_equal_transformers(tok_dir):
    ours = Tokenizer.from_pretrained(tok_dir)
    ref = transformers.AutoTokenizer.from_pretrained(tok_dir)
    text = "The client records op graphs; the server replays them.\n  Twice!"
    assert ours.encode(text) == ref(text)["input_ids"]
    assert ours.decode(ours.encode(text)) == ref.decode(ref(text)["input_ids"])
    assert ours.eos_token_id == ref.eos_token_id
    for chat in CHATS:
        for prompt in (False, True):
            want = ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt)
            assert ours.apply_chat_template(chat, add_generation_prompt=prompt) == want
        ids = ref.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
        assert ours.apply_chat_template(chat, tokenize=True) == list(ids)


def test_assistant_labels_equal_transformers_assistant_mask(tok_dir):
    tok = Tokenizer.from_pretrained(tok_dir)
    ref = transformers.AutoTokenizer.from_pretrained(tok_dir)
    for chat in CHATS:
        ids, labels = text_data.tokenize_chat(tok, chat, "t")
        out = ref.apply_chat_template(
            chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert ids == list(out["input_ids"])
        mask = np.array(out["assistant_masks"], bool)
        assert mask.any() and not mask.all()
        np.testing.assert_array_equal(np.array(labels) != text_data.IGNORE, mask)
        np.testing.assert_array_equal(np.array(labels)[mask], np.array(ids)[mask])


def test_templates_without_generation_blocks_label_each_assistant_continuation(tmp_path):
    plain = CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    tok = Tokenizer.from_pretrained(make_tokenizer(tmp_path, template=plain))
    ids, labels = text_data.tokenize_chat(tok, CHATS[1], "t")
    learned = tok.decode([i for i, lab in zip(ids, labels) if lab != text_data.IGNORE])
    assert learned == "hello there<|im_end|>\n"


def test_packing_and_rows(tok_dir):
    tok = Tokenizer.from_pretrained(tok_dir)
    fmt, records = text_data.read_records(
        "\n".join(json.dumps({"messages": c}) for c in CHATS).encode()
    )
    assert fmt == "chat"
    examples = text_data.tokenize(tok, fmt, records)
    rows = text_data.make_rows(examples, 16, True, 0)
    total = sum(len(e) for e, _ in examples)
    assert rows.inputs.shape[1] == 16 and len(rows) <= -(-total // 17)
    unpacked = text_data.make_rows(examples, 64, False, 0)
    assert unpacked.inputs.shape == (2, 64)
    ids, labels = examples[1]
    np.testing.assert_array_equal(unpacked.targets[1, : len(ids) - 1], labels[1:])
    assert (unpacked.targets[1, len(ids) - 1 :] == text_data.IGNORE).all()
    fmt, docs = text_data.read_records(b'{"text": "one"}\n\n{"text": "two"}\n')
    assert (fmt, docs) == ("jsonl", ["one", "two"])
    assert text_data.read_records(b"plain text\nlines")[0] == "text"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"text": "a"}\n{"text": "b",}\n', r"line 2 is not valid JSON"),
        (b'{"text": "a"}\n\n{"txt": "b"}\n', r'line 3 has no "text" string'),
        (b'{"messages": [{"role": "user", "content": "x"}]}\n', r"line 1: no assistant"),
        (b'{"messages": [{"role": "user"}]}\n', r'messages\[0\] needs "role" and "content"'),
        (b"\xff\xfe", r"not UTF-8"),
    ],
)
def test_bad_data_is_refused_naming_the_line(raw, message):
    with pytest.raises(text_data.DatasetError, match=message):
        text_data.read_records(raw)


def test_missing_template_and_mismatched_vocab_are_refused(tmp_path):
    tok = Tokenizer.from_pretrained(make_tokenizer(tmp_path, template=None))
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tok.apply_chat_template(CHATS[0])
    with pytest.raises(ValueError, match="has 400 ids but the model's vocab_size is 64"):
        tok.check_vocab(64)
