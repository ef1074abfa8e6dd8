"""Text in and out of `generate` against transformers: a prompt string and chat messages
through the chat template, text back with and without special tokens, equal to
AutoTokenizer + apply_chat_template + generate + decode on the same random checkpoint; the
streamed pieces join to that text."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import nn
from burn_remote.tokenizer import ChatTemplateError, Tokenizer

from tests.hf.tokenizer_dir import make_tokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("jinja2")

NEW = 32
CHAT = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What does the server cache?"},
]
PROMPT = "The client records op graphs; the server"


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    """A tiny Llama (random weights) saved beside a BPE tokenizer with a ChatML template.
    Two lm_head rows are set to copies (x1.05) of rows of tokens greedy decoding of the
    chat picks, so the special <|im_start|> turns up in the text and <|im_end|> (the EOS)
    ends the reply early: both paths are then exercised (the tests check they were)."""
    import torch

    directory = make_tokenizer(tmp_path_factory.mktemp("llama_text"))
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    chat = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=True)
    prompt = torch.tensor([chat["input_ids"]])

    def greedy() -> list[int]:
        out = model.generate(prompt, max_new_tokens=NEW, do_sample=False, eos_token_id=None)
        return out[0, prompt.shape[1] :].tolist()

    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.1) if "norm" in name else p.normal_(0, 0.1)
        head = model.lm_head.weight
        im_start = tok.convert_tokens_to_ids("<|im_start|>")
        eos, original = tok.eos_token_id, head.clone()
        # Copying a chosen token's row (x1.05) makes the special token win where that token
        # did. Which tokens greedy decoding picks depends on the host's float rounding, so
        # the choice is searched for: the first (where, which) that puts <|im_start|> on the
        # path and ends the reply with EOS after it, before NEW tokens.
        path = None
        for at in range(2, NEW // 2):
            head.copy_(original)
            head[im_start] = original[greedy()[at]] * 1.05
            first = greedy()
            if im_start not in first:
                continue
            for stop in range(first.index(im_start) + 1, NEW - 1):
                head[eos] = head[first[stop]] * 1.05
                path = greedy()
                if _both_specials_and_two_pieces(tok, path, im_start, eos):
                    break
                head[eos] = original[eos]
                path = None
            if path is not None:
                break
    assert path is not None, "no lm_head rows found that exercise both special tokens"
    model.save_pretrained(directory)
    return directory


def _both_specials_and_two_pieces(tok, path: list[int], im_start: int, eos: int) -> bool:
    """Whether ``path`` has <|im_start|> before the EOS, and a reply whose text comes in two
    pieces at least: its first visible token decodes to a whole character or more, and the
    text before the EOS is longer. Which path a seed gives depends on the host's float
    rounding (even on where arrays happen to lie in memory), so the search asks for all of
    what the tests check rather than hoping for it."""
    if im_start not in path or eos not in path or path.index(im_start) > path.index(eos):
        return False
    reply = path[: path.index(eos)]
    visible = [t for t in reply if t != im_start]
    if len(visible) < 2:
        return False
    first = tok.decode(visible[:1], skip_special_tokens=True)
    text = tok.decode(reply, skip_special_tokens=True)
    return bool(first) and "\ufffd" not in first and text.startswith(first) and text != first


def _hf_text(directory, ids: list[int], skip: bool, **kw) -> tuple[str, int]:
    """transformers' new text and how many tokens it generated."""
    import torch

    tok = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, **kw)
    new = out[0, len(ids) :].tolist()
    return tok.decode(new, skip_special_tokens=skip), len(new)


def test_prompt_string_text_equals_transformers(text_dir) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(text_dir)
    ids = tok(PROMPT)["input_ids"]
    model = nn.AutoModelForCausalLM.from_pretrained(text_dir)
    for skip in (True, False):
        want, n = _hf_text(text_dir, ids, skip, eos_token_id=None, pad_token_id=0)
        got = model.generate_text(PROMPT, NEW, eos_token_id=None, skip_special_tokens=skip)
        assert got == want
        assert model.generation_stats["new_tokens"] == n == NEW


def test_chat_through_template_stops_at_eos_and_streams_the_same_text(text_dir) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(text_dir)
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=True)
    ids = list(ids["input_ids"])
    want, n = _hf_text(text_dir, ids, True)  # transformers' defaults: EOS from the config
    assert n < NEW  # <|im_end|> ended the reply
    model = nn.AutoModelForCausalLM.from_pretrained(text_dir)
    assert model.generate_text(CHAT, NEW) == want
    assert model.generation_stats["new_tokens"] == n
    pieces = list(model.stream_text(CHAT, NEW))
    assert len(pieces) > 1 and "".join(pieces) == want
    # an explicit tokenizer (object or directory) is the same as the model's own
    assert model.generate_text(CHAT, NEW, tokenizer=Tokenizer.from_pretrained(text_dir)) == want
    raw = _hf_text(text_dir, ids, False)[0]
    assert "<|im_start|>" in raw and "<|im_start|>" not in want  # skipping mattered here
    assert model.generate_text(CHAT, NEW, tokenizer=text_dir, skip_special_tokens=False) == raw


def test_text_pieces_wait_for_whole_characters(text_dir) -> None:
    from burn_remote.nn._generate_text import text_pieces

    tok = Tokenizer.from_pretrained(text_dir)
    text = "Cache hit: \u00e9t\u00e9 \u2014 \u65e5\u672c \U0001f600 done"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = list(text_pieces(tok, (np.array([i]) for i in ids), True))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_text_generation_refuses_what_it_cannot_do(text_dir, tmp_path) -> None:
    model = nn.AutoModelForCausalLM.from_pretrained(text_dir)
    with pytest.raises(ValueError, match="string or a non-empty list"):
        model.generate_text(["not", "messages"], 4)
    with pytest.raises(ValueError, match="no tokens"):
        model.generate_text("", 4)
    bare = make_tokenizer(tmp_path / "bare", template=None)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        model.generate_text(CHAT, 4, tokenizer=bare)
    built = nn.GPT(nn.GPTConfig(n_layer=1, n_head=2, d_model=16, vocab=500, context=32))
    with pytest.raises(ValueError, match="needs a tokenizer"):
        built.generate_text(PROMPT, 4)
    small = nn.GPT(nn.GPTConfig(n_layer=1, n_head=2, d_model=16, vocab=50, context=32))
    with pytest.raises(ValueError, match="not this model's tokenizer"):
        small.generate_text(PROMPT, 4, tokenizer=text_dir)
