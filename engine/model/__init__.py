"""Decoder-only model families over the paged KV cache (engine/model/families.py lists them).

Importing the package registers every family, so a lookup anywhere below finds them all."""

from engine.model import families
from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM", "ModelConfig", "families"]
