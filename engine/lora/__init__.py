"""LoRA adapters served beside the base weights: PEFT folders (adapter.py) and llama.cpp's GGUF
LoRA files (gguf_adapter.py) read, whichever a path is (sources.py), the adapters
loaded into one engine (registry.py), and each step's rows grouped by adapter, whose low-rank
deltas are added after the base projections (delta.py)."""

from engine.lora.adapter import LoraAdapter, LoraError, read_peft_adapter
from engine.lora.delta import LoraRows
from engine.lora.registry import LoraRegistry

__all__ = ["LoraAdapter", "LoraError", "LoraRegistry", "LoraRows", "read_peft_adapter"]
