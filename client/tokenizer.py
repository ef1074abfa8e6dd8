"""Text for the open LLMs: Hugging Face `tokenizers` and the chat templates of a model dir.

A model directory's `tokenizer.json` is loaded by `tokenizers` itself (never a hand-written
BPE), so ids equal transformers' `AutoTokenizer`. Its chat template (`chat_template.jinja`,
written by transformers 5, or `tokenizer_config.json`'s `chat_template`) is rendered the way
transformers renders it: jinja2's sandbox with trim_blocks and lstrip_blocks, loop controls,
transformers' `tojson`, `raise_exception` and `strftime_now`, and the special tokens
(`bos_token`, `eos_token`, ...) as variables. Templates come from the Hub and are untrusted
code, hence the sandbox.

`tokenizers` and `jinja2` are imported on first use (the `hf` extra), not with
`burn_remote`.
"""

from __future__ import annotations

import contextvars
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")
"""tokenizer_config.json entries that templates see as variables (transformers' map)."""


class ChatTemplateError(ValueError):
    """A chat could not be rendered: no template, or the template raised."""


@dataclass
class Tokenizer:
    """A `tokenizers.Tokenizer` with the special tokens and chat template of its directory."""

    backend: Any
    special_tokens: dict[str, str] = field(default_factory=dict)
    chat_template: str | None = None
    source: str = ""

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> Tokenizer:
        """Load `tokenizer.json` (+ tokenizer_config.json, chat_template.jinja if present)."""
        from tokenizers import Tokenizer as Backend

        directory = Path(directory)
        path = directory / TOKENIZER
        if not path.is_file():
            raise FileNotFoundError(
                f"{directory}: no {TOKENIZER} (only fast tokenizers load here; save one with "
                "transformers' PreTrainedTokenizerFast.save_pretrained)"
            )
        config: dict[str, Any] = {}
        if (directory / TOKENIZER_CONFIG).is_file():
            config = json.loads((directory / TOKENIZER_CONFIG).read_text())
        template = config.get("chat_template")
        if (directory / CHAT_TEMPLATE).is_file():
            template = (directory / CHAT_TEMPLATE).read_text()
        if isinstance(template, list):  # named templates: transformers uses "default"
            named = {t["name"]: t["template"] for t in template}
            template = named.get("default")
        special = {}
        for key in SPECIAL_TOKENS:
            value = config.get(key)
            if isinstance(value, dict):  # the AddedToken form
                value = value.get("content")
            if isinstance(value, str):
                special[key] = value
        return cls(Backend.from_file(str(path)), special, template, str(directory))

    # --- ids ------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Ids run from 0 to vocab_size - 1 (added tokens included)."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`, as transformers' `tokenizer(text)["input_ids"]`."""
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids of `text` (no special tokens added) and each one's character span."""
        enc = self.backend.encode(text, add_special_tokens=False)
        return list(enc.ids), [tuple(o) for o in enc.offsets]

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of token ``ids`` (any iterable of ints, e.g. a generated row); with
        ``skip_special_tokens`` the eos, padding and other special tokens are left out."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_id(self, name: str) -> int | None:
        """The id of a special token by its role ("eos_token"), None if the dir names none."""
        token = self.special_tokens.get(name)
        return None if token is None else self.backend.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id (what generation stops at and packing puts between documents),
        None when the tokenizer directory names no eos token."""
        return self.token_id("eos_token")

    def check_vocab(self, vocab: int, where: str = "tokenizer") -> None:
        """Refuse a tokenizer whose ids do not fit a model's embedding of `vocab` rows."""
        if self.vocab_size > vocab:
            raise ValueError(
                f"{where}: {self.source or 'the tokenizer'} has {self.vocab_size} ids but the "
                f"model's vocab_size is {vocab}: it is not this model's tokenizer"
            )

    # --- chat -----------------------------------------------------------------------------
    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        **kwargs: Any,
    ) -> str | list[int]:
        """Render `messages` as transformers' `apply_chat_template` does (text, or its ids
        without added special tokens, as transformers tokenizes a rendered chat)."""
        text = render_chat(
            self.chat_template, messages, add_generation_prompt, {**self.special_tokens, **kwargs}
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def uses_generation_tags(self) -> bool:
        """Whether the template marks assistant text with `{% generation %}` blocks."""
        return (
            self.chat_template is not None
            and "generation" in self.chat_template
            and any(tag in self.chat_template for tag in ("{% generation", "{%- generation"))
        )

    def assistant_spans(self, messages: list[dict[str, Any]]) -> tuple[str, list]:
        """The rendered chat and the character spans its `{% generation %}` blocks cover."""
        return render_chat_spans(self.chat_template, messages, self.special_tokens)


_TRACKING: contextvars.ContextVar[tuple[list[str], list[tuple[int, int]]] | None] = (
    contextvars.ContextVar("generation_spans", default=None)
)
"""While a chat renders with spans tracked: the blocks rendered so far and the spans."""


def _environment() -> Any:
    """The jinja2 environment transformers compiles chat templates in (sandboxed), with its
    `{% generation %}` tag: the text inside is an assistant's, its character span tracked."""
    import datetime

    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_span", [])
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _span(self, caller: Any) -> str:
            text = caller()
            tracking = _TRACKING.get()
            if tracking is not None:
                blocks, spans = tracking
                start = len("".join(blocks))
                spans.append((start, start + len(text)))
            return text

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None,
               separators: Any = None, sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


_COMPILED: dict[str, Any] = {}


def render_chat(
    template: str | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = False,
    variables: dict[str, Any] | None = None,
) -> str:
    """``messages`` rendered with a Jinja chat ``template`` as transformers does (same globals
    and filters); ``add_generation_prompt`` appends the assistant's turn opener.

    Raises ChatTemplateError when there is no template or it fails to render."""
    return _render(template, messages, add_generation_prompt, variables, None)


def render_chat_spans(
    template: str | None, messages: list[dict[str, Any]], variables: dict[str, Any] | None
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered chat and the character spans of its `{% generation %}` blocks."""
    spans: list[tuple[int, int]] = []
    return _render(template, messages, False, variables, spans), spans


def _render(
    template: str | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    variables: dict[str, Any] | None,
    spans: list[tuple[int, int]] | None,
) -> str:
    if template is None:
        raise ChatTemplateError(
            "this tokenizer has no chat template (tokenizer_config.json's chat_template or "
            f"{CHAT_TEMPLATE}); chat data needs one"
        )
    import jinja2

    compiled = _COMPILED.get(template)
    if compiled is None:
        compiled = _COMPILED[template] = _environment().from_string(template)
    context = dict(
        messages=messages, tools=None, documents=None,
        add_generation_prompt=add_generation_prompt, **(variables or {}),
    )  # fmt: skip
    try:
        if spans is None:
            return compiled.render(**context)
        blocks: list[str] = []
        token = _TRACKING.set((blocks, spans))
        try:
            for block in compiled.generate(**context):
                blocks.append(block)
        finally:
            _TRACKING.reset(token)
        return "".join(blocks)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template: {exc}") from None


__all__ = ["ChatTemplateError", "Tokenizer", "render_chat", "render_chat_spans"]
