"""Decoder-only model families over the paged KV cache (engine/model/registry.py lists them)."""

from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM", "ModelConfig"]
