"""``burn-remote generate``: stream a model's continuation of a prompt to the terminal.

The model directory (a transformers ``save_pretrained`` directory with a ``tokenizer.json``)
is read here and its weights are uploaded to the device: the server needs no copy of it.
With ``--peer`` the model runs on that server (the KV cache stays there, tokens come back in
blocks); without it, on this machine's CPU. Only ``argparse`` is imported until the command
runs, so ``burn-remote --help`` stays instant.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

DEFAULT_MAX_NEW_TOKENS = 128
"""New tokens at most when --max-new-tokens is not given."""

DESCRIPTION = """\
Generate text from a prompt and print it as it is produced.

The model is a transformers directory (config.json, model.safetensors, tokenizer.json:
Llama, Qwen2, Mistral or GPT-2 layouts) on this machine. Its weights are uploaded to the
device; with --peer that is a burn-remote server, which keeps the KV cache and runs the
decode steps while this client reads the tokens in blocks; without --peer the model runs
on the local CPU. The prompt is tokenized as transformers' tokenizer(prompt) does; with
--chat it is a user message rendered through the model's chat template (with --system
before it). Decoding is greedy unless --sample is given."""

EXAMPLES = """\
examples:
  burn-remote generate --model ./SmolLM2-135M "The capital of France is"
  burn-remote generate --peer 12D3KooW...@10.0.0.5:7000 --model ./Qwen2-0.5B-Instruct \\
      --chat --max-new-tokens 64 "Write a haiku about caches."
  burn-remote generate --model ./base --adapter ./my-lora --sample --seed 1 "Once upon"

The text goes to stdout; errors and --stats figures go to stderr."""


def add_parser(sub: argparse._SubParsersAction, target_help: str) -> None:
    """Register ``generate`` and its flags on the ``burn-remote`` subcommand parser
    (`target_help`: what the other subcommands say a PEER is)."""
    p = sub.add_parser(
        "generate",
        help="generate text from a prompt with a model, locally or on a server",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("prompt", help="the prompt text ('-': read it from stdin)")
    p.add_argument("--model", required=True, metavar="DIR", help="the model directory")
    p.add_argument(
        "--peer", metavar="PEER", help=f"run on this server ({target_help}); default: the local CPU"
    )
    p.add_argument("--key", metavar="FILE", help="this client's key file (with --peer)")
    p.add_argument(
        "--adapter", metavar="DIR", help="a LoRA adapter directory (PEFT layout) to apply"
    )
    p.add_argument(
        "--max-new-tokens",
        type=_positive,
        default=DEFAULT_MAX_NEW_TOKENS,
        metavar="N",
        help="stop after N new tokens, or earlier at the end-of-text token (default %(default)s)",
    )
    p.add_argument(
        "--chat", action="store_true", help="the prompt is a user message (chat template)"
    )
    p.add_argument("--system", metavar="TEXT", help="with --chat: a system message first")
    p.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        help="the weights' dtype on the device (default: as stored)",
    )
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument(
        "--temperature", type=float, default=1.0, metavar="T", help="with --sample (default 1)"
    )
    p.add_argument(
        "--top-k", type=int, default=50, metavar="K", help="with --sample (default 50; 0: off)"
    )
    p.add_argument(
        "--top-p", type=float, default=1.0, metavar="P", help="with --sample (default 1: off)"
    )
    p.add_argument(
        "--seed",
        type=int,
        metavar="KEY",
        help="with --sample: the sampling key (same key, same text)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        metavar="X",
        help="transformers' (default 1: off)",
    )
    p.add_argument("--keep-special-tokens", action="store_true", help="print special tokens too")
    p.add_argument(
        "--stats",
        action="store_true",
        help="print time to first token and tokens/s to stderr at the end",
    )
    p.set_defaults(func=cmd_generate)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def cmd_generate(args: argparse.Namespace) -> int:
    """Load the model on the device, then print each piece of text as it arrives."""
    from burn_remote import RemoteError
    from burn_remote._recorder import OpFailed
    from burn_remote.nn import HFConfigError

    prompt: Any = sys.stdin.read() if args.prompt == "-" else args.prompt
    if args.chat:
        system = [{"role": "system", "content": args.system}] if args.system else []
        prompt = [*system, {"role": "user", "content": prompt}]
    elif args.system:
        print("burn-remote generate: --system needs --chat", file=sys.stderr)
        return 2
    device = None
    try:
        device = _device(args)
        model = _load(args, device)
        sampling: dict[str, Any] = {"repetition_penalty": args.repetition_penalty}
        if args.sample:
            sampling.update(
                do_sample=True, temperature=args.temperature, top_k=args.top_k,
                top_p=args.top_p, key=args.seed,
            )  # fmt: skip
        start = time.perf_counter()
        first = None
        for piece in model.stream_text(
            prompt, args.max_new_tokens, skip_special_tokens=not args.keep_special_tokens,
            **sampling,
        ):  # fmt: skip
            first = first or time.perf_counter()
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        end = time.perf_counter()
        if args.stats:
            _print_stats(model.generation_stats or {}, start, first or end, end)
    except (OpFailed, RemoteError, HFConfigError, OSError, ValueError, KeyError) as exc:
        print(f"\nburn-remote generate: {exc}", file=sys.stderr)
        return 1
    finally:
        if device is not None and args.peer:
            device.close()
    return 0


def _device(args: argparse.Namespace) -> Any:
    from burn_remote import Device, RemoteDevice

    if args.peer:
        return RemoteDevice(args.peer, key=args.key)
    if args.key:
        raise ValueError("--key is for a server connection: give --peer too")
    return Device.cpu()


def _load(args: argparse.Namespace, device: Any) -> Any:
    from burn_remote import nn

    model = nn.AutoModelForCausalLM.from_pretrained(args.model, device=device, dtype=args.dtype)
    if args.adapter:
        model.load_adapter(args.adapter)
    return model.eval()


def _print_stats(stats: dict[str, int], start: float, first: float, end: float) -> None:
    tokens = stats.get("new_tokens", 0)
    rate = (tokens - 1) / (end - first) if tokens > 1 and end > first else float("nan")
    print(
        f"{tokens} tokens; first token {1e3 * (first - start):.0f} ms; "
        f"{rate:.1f} tokens/s after it; {stats.get('reads', 0)} reads",
        file=sys.stderr,
    )


__all__ = ["DEFAULT_MAX_NEW_TOKENS", "add_parser", "cmd_generate"]
