"""`AutoModelForCausalLM`: transformers' entry point, dispatching on config.json's model_type.

Llama, Qwen2 and Mistral directories build a `LlamaForCausalLM` (module names as
transformers'); GPT-2 directories build today's `GPT` through the same door.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._device import Device
from ._hf import CONFIG, HFConfigError, read_config
from ._llm_config import MODEL_TYPES


def _device(device: Device | str | None) -> Device | None:
    if device is None or isinstance(device, Device):
        return device
    from .._creation import device as parse

    return parse(device)


class AutoModelForCausalLM:
    """`from_pretrained(directory)` and `from_config(doc)` for llama, qwen2, mistral, gpt2."""

    def __init__(self) -> None:
        raise TypeError("use AutoModelForCausalLM.from_pretrained(directory) or from_config")

    @staticmethod
    def from_pretrained(
        directory: str | Path, device: Device | str | None = None, dtype: Any = None
    ) -> Any:
        """Load a `save_pretrained` directory onto `device` (default the CPU), in eval mode.

        Args:
            dtype: the weights' dtype on the device (float32, float16, bfloat16); default
                the dtype they are stored in.
        Raises:
            HFConfigError: config.json asks for something not implemented (names the field).
            CheckpointError: tensors missing, extra, or shaped unlike the config.
        """
        doc = read_config(directory)
        model_type = doc.get("model_type")
        if model_type == "gpt2":
            if dtype is not None and str(dtype) != "float32":
                raise HFConfigError(f"{directory}: GPT-2 models load as float32 only")
            from ._gpt import GPT

            return GPT.from_pretrained(directory, device=_device(device))
        if model_type not in MODEL_TYPES:
            raise HFConfigError(
                f"{Path(directory) / CONFIG}: model_type={model_type!r} is not supported "
                f"(supported: {[*MODEL_TYPES, 'gpt2']})"
            )
        from ._llm_io import load_pretrained

        return load_pretrained(directory, _device(device), dtype)

    @staticmethod
    def from_config(
        doc: dict[str, Any] | str | Path, device: Device | str | None = None, dtype: Any = "float32"
    ) -> Any:
        """A freshly initialised model for a config.json document (or its directory)."""
        if not isinstance(doc, dict):
            doc = read_config(doc)
        from ._llm_io import from_config

        return from_config(doc, _device(device), dtype)
