"""A small byte-level BPE tokenizer trained with `tokenizers` on this repository's text, saved
by transformers with a ChatML chat template (its assistant turns in generation blocks)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}{% else %}{{ m['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def corpus() -> list[str]:
    """The repository's README and Python sources: real text, nothing downloaded."""
    files = [ROOT / "README.md", *sorted((ROOT / "client").rglob("*.py"))[:40]]
    return [p.read_text(errors="replace") for p in files]


def make_tokenizer(directory: Path, vocab: int = 400, template: str | None = CHATML) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )  # fmt: skip
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(directory)
    return directory
