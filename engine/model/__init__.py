"""Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2) over the paged KV cache."""

from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM", "ModelConfig"]
