"""Oracles for the Hugging Face round trips: real transformers and PEFT classes on the CPU.

Models are made from a config (random init) and saved with `save_pretrained`; nothing is
downloaded (HF_HUB_OFFLINE is set before transformers is imported).
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
