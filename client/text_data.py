"""Fine-tuning data for causal LMs: plain text, JSONL `text` records, JSONL chat `messages`.

Every example becomes token ids and per-token labels; labels are the ids where the loss
counts and IGNORE elsewhere. Chat examples count only the assistant turns, as TRL's SFT with
`assistant_only_loss`: the chat is rendered with the tokenizer's template, and a token is an
assistant token when it starts inside the text an assistant message adds (from the prompt
the template renders before it, `add_generation_prompt=True`, to the chat rendered up to and
including it; its end-of-turn marker is therefore trained too).

Examples are then packed (concatenated, eos between documents, cut into rows of seq_len + 1)
or, without packing, each truncated or padded to one row. A row's inputs are its first
seq_len ids and its targets the labels shifted by one, ready for `model.loss`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

IGNORE = -100
"""The label of a token the loss skips (transformers' and PyTorch's ignore_index)."""
FORMATS = ("auto", "text", "jsonl", "chat")


class DatasetError(ValueError):
    """Bad training data; names the line (1-based) or record at fault."""


@dataclass(frozen=True)
class Rows:
    """(N, seq_len) inputs and targets (IGNORE where no loss), int64."""

    inputs: np.ndarray
    targets: np.ndarray

    def __len__(self) -> int:
        return len(self.inputs)


def read_records(raw: bytes, fmt: str = "auto", where: str = "data") -> tuple[str, list[Any]]:
    """The file's format ("text", "jsonl" or "chat") and its examples: strings, or lists of
    chat messages. "auto" reads JSONL when the first non-empty line is a JSON object."""
    if fmt not in FORMATS:
        raise DatasetError(f"{where}: format {fmt!r} is not one of {list(FORMATS)}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{where}: not UTF-8 text ({exc})") from None
    lines = text.splitlines()
    if fmt == "auto":
        first = next((ln for ln in lines if ln.strip()), "")
        fmt = "jsonl" if first.lstrip().startswith("{") else "text"
    if fmt == "text":
        if not text.strip():
            raise DatasetError(f"{where}: the file holds no text")
        return "text", [text]
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: line {number} is not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise DatasetError(f"{where}: line {number} is not a JSON object")
        records.append((number, record))
    if not records:
        raise DatasetError(f"{where}: no records")
    if fmt == "jsonl" and "messages" in records[0][1]:
        fmt = "chat"
    out: list[Any] = []
    for number, record in records:
        if fmt == "chat":
            out.append(_messages(record, f"{where}: line {number}"))
        else:
            value = record.get("text")
            if not isinstance(value, str):
                raise DatasetError(f'{where}: line {number} has no "text" string')
            out.append(value)
    return ("chat" if fmt == "chat" else "jsonl"), out


def _messages(record: dict[str, Any], where: str) -> list[dict[str, str]]:
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f'{where}: "messages" must be a non-empty list')
    for k, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):  # fmt: skip
            raise DatasetError(f'{where}: messages[{k}] needs "role" and "content" strings')
    if not any(m["role"] == "assistant" for m in messages):
        raise DatasetError(f"{where}: no assistant message, so nothing to learn")
    return messages


def tokenize_text(tok: Any, text: str) -> tuple[list[int], list[int]]:
    """Ids of a document (the tokenizer's own special tokens) + eos; every label counts."""
    ids = tok.encode(text)
    eos = tok.eos_token_id
    if eos is not None and (not ids or ids[-1] != eos):
        ids = [*ids, eos]
    return ids, list(ids)


def tokenize_chat(tok: Any, messages: list[dict[str, str]], where: str) -> tuple[list, list]:
    """Ids of a rendered chat and labels that keep only its assistant tokens: the template's
    `{% generation %}` blocks where it has them (transformers' assistant mask, what TRL
    trains on), else each assistant message's continuation (module docstring)."""
    if tok.uses_generation_tags():
        full, spans = tok.assistant_spans(messages)
        return _labelled(tok, full, spans)
    full = tok.apply_chat_template(messages)
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tok.apply_chat_template(messages[:k], add_generation_prompt=True) if k else ""
        upto = tok.apply_chat_template(messages[: k + 1])
        if not (full.startswith(upto) and upto.startswith(before)):
            raise DatasetError(
                f"{where}: the chat template does not render messages[{k}] as a continuation "
                "of the messages before it, so its tokens cannot be told apart"
            )
        spans.append((len(before), len(upto)))
    return _labelled(tok, full, spans)


def _labelled(tok: Any, full: str, spans: list[tuple[int, int]]) -> tuple[list, list]:
    ids, offsets = tok.encode_with_offsets(full)
    labels = [
        i if any(a <= start < b for a, b in spans) else IGNORE
        for i, (start, _) in zip(ids, offsets)
    ]
    return ids, labels


def tokenize(tok: Any, fmt: str, examples: list[Any], where: str = "data") -> list[tuple]:
    """Ids and labels of each example, in order: chat examples (``fmt == "chat"``) keep labels
    only on assistant tokens, text examples on every token (see `tokenize_chat`,
    `tokenize_text`). Raises DatasetError naming the 1-based record whose assistant turns the
    template does not render as continuations, ChatTemplateError when the template fails."""
    out = []
    for k, example in enumerate(examples):
        if fmt == "chat":
            out.append(tokenize_chat(tok, example, f"{where}: record {k + 1}"))
        else:
            out.append(tokenize_text(tok, example))
    return out


def make_rows(examples: list[tuple], seq_len: int, packing: bool, pad_id: int) -> Rows:
    """Rows of seq_len inputs and targets (see the module docstring)."""
    width = seq_len + 1
    if packing:
        ids = np.fromiter((i for e, _ in examples for i in e), np.int64)
        labels = np.fromiter((x for _, lab in examples for x in lab), np.int64)
        extra = -len(ids) % width
        ids = np.concatenate([ids, np.full(extra, pad_id, np.int64)]).reshape(-1, width)
        labels = np.concatenate([labels, np.full(extra, IGNORE, np.int64)]).reshape(-1, width)
    else:
        ids = np.full((len(examples), width), pad_id, np.int64)
        labels = np.full((len(examples), width), IGNORE, np.int64)
        for row, (e, lab) in enumerate(examples):
            n = min(len(e), width)
            ids[row, :n], labels[row, :n] = e[:n], lab[:n]
    targets = labels[:, 1:]
    keep = (targets != IGNORE).any(axis=1)
    if not keep.any():
        raise DatasetError("data: no token left to learn from (every label is ignored)")
    return Rows(np.ascontiguousarray(ids[keep, :-1]), np.ascontiguousarray(targets[keep]))


__all__ = ["FORMATS", "IGNORE", "DatasetError", "Rows", "make_rows", "read_records", "tokenize"]
