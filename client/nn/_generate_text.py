"""Text in and out of `generate`: a prompt string or chat messages, text back.

A model loaded from a directory (`from_pretrained`) that holds a `tokenizer.json` has a
tokenizer (`burn_remote.tokenizer.Tokenizer`, ids equal to transformers' AutoTokenizer), or
one is passed. The prompt becomes ids the way transformers makes them:

- a string: `tokenizer(prompt)["input_ids"]`, the tokenizer's own special tokens added;
- chat messages (a list of {"role", "content"} dicts): `apply_chat_template(messages,
  add_generation_prompt=True, tokenize=True)`, the model's chat template rendered.

Streamed text is decoded from every new token so far and only the part after what was
already given out is yielded, held back while it ends in an incomplete UTF-8 sequence (a
byte-level BPE token may carry half a character), so the pieces join to the decoded whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

INCOMPLETE = "\ufffd"
"""What a decoder gives for bytes that do not yet form a character: wait for the next."""

_LOADED: dict[str, Any] = {}
"""Tokenizers loaded from model directories, by path: `generate_text` loads one once."""


def tokenizer_of(model: Any, tokenizer: Any = None) -> Any:
    """The tokenizer to use: `tokenizer` (a Tokenizer or a directory), else the one in the
    directory the model was loaded from.

    Raises:
        ValueError: neither, naming where it looked.
    """
    from ..tokenizer import TOKENIZER, Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if tokenizer is not None:
        source = Path(tokenizer)
    else:
        name = getattr(model, "name_or_path", None)
        if name is None or not (Path(name) / TOKENIZER).is_file():
            where = f"{name}/{TOKENIZER}" if name else "no directory (built, not loaded)"
            raise ValueError(
                f"text generation needs a tokenizer: the model's directory has none ({where}); "
                "pass tokenizer=Tokenizer.from_pretrained(DIR) or tokenizer=DIR"
            )
        source = Path(name)
    key = str(source.resolve())
    if key not in _LOADED:
        _LOADED[key] = Tokenizer.from_pretrained(source)
    return _LOADED[key]


def prompt_ids(tokenizer: Any, prompt: Any, vocab: int) -> np.ndarray:
    """(1, T) int64 ids of a prompt string or a chat (list of message dicts), as
    transformers' tokenizer(prompt) / apply_chat_template(chat, add_generation_prompt=True).

    Raises:
        ValueError: an empty prompt, or neither a string nor a list of messages.
    """
    tokenizer.check_vocab(vocab, "generate_text")
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt) and prompt:
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    else:
        raise ValueError(
            "generate_text: the prompt must be a string or a non-empty list of chat messages "
            f"({{'role': ..., 'content': ...}} dicts), got {type(prompt).__name__}"
        )
    if not ids:
        raise ValueError("generate_text: the prompt encodes to no tokens")
    return np.asarray(ids, np.int64)[None]


def eos_ids(model: Any, tokenizer: Any, eos_token_id: Any, from_config: Any) -> Any:
    """The default EOS of text generation: the config's EOS ids and the tokenizer's EOS
    token (a chat template ends a turn with the latter, which a config may not list)."""
    if eos_token_id is not from_config:
        return eos_token_id
    config = (getattr(model, "hf_config", None) or {}).get("eos_token_id")
    ids = [] if config is None else [config] if isinstance(config, int) else list(config)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids or None


def text_pieces(
    tokenizer: Any, columns: Iterator[np.ndarray], skip_special_tokens: bool
) -> Iterator[str]:
    """The decoded text of row 0 of `columns` (batch 1), piece by piece, as tokens come."""
    ids: list[int] = []
    given = ""
    for column in columns:
        ids.append(int(column[0]))
        text = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        if text.endswith(INCOMPLETE) or not text.startswith(given):
            continue  # half a character, or a prefix that changed: wait for more tokens
        if len(text) > len(given):
            yield text[len(given) :]
            given = text
    text = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    if text.startswith(given) and len(text) > len(given):
        yield text[len(given) :]


__all__ = ["eos_ids", "prompt_ids", "text_pieces", "tokenizer_of"]
