"""KV-cache and weight memory from a model's config alone (no weights are loaded).

The seed article's formula: KV bytes per token = 2 x layers x kv_heads x head_dim x
bytes_per_value (the 2 is K and V). The cache holds whole blocks of `block_size`
positions, so the token capacity is rounded down to blocks, and a sequence of C
positions holds ceil(C / block_size) blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.model.config import ModelConfig

KV_DTYPE_BYTES = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "half": 2, "bf16": 2,
                  "bfloat16": 2, "fp8": 1, "int8": 1}
WEIGHT_BYTES = {"fp32": 4.0, "float32": 4.0, "fp16": 2.0, "float16": 2.0, "bf16": 2.0,
                "bfloat16": 2.0, "int8": 1.0, "int4": 0.5, "none": 0.0}


def dtype_bytes(name: str, table: dict[str, Any], what: str) -> Any:
    key = name.lower()
    if key not in table:
        raise ValueError(f"unknown {what} {name!r}; choose from {sorted(table)}")
    return table[key]


def kv_bytes_per_token(cfg: ModelConfig, kv_dtype: str) -> int:
    """2 (K and V) x layers x KV heads x head_dim x bytes per value."""
    elem = dtype_bytes(kv_dtype, KV_DTYPE_BYTES, "KV-cache dtype")
    return int(2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * elem)


def count_parameters(cfg: ModelConfig) -> int:
    """Parameters of a Llama-family decoder, from its shapes."""
    h, hd = cfg.hidden_size, cfg.head_dim
    attn = h * cfg.num_attention_heads * hd * 2 + h * cfg.num_key_value_heads * hd * 2
    if cfg.attention_bias:
        attn += (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd
    mlp = 3 * h * cfg.intermediate_size
    per_layer = attn + mlp + 2 * h  # two RMSNorm weights
    embed = cfg.vocab_size * h
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * h
    return cfg.num_hidden_layers * per_layer + embed + head + h


def weight_bytes(cfg: ModelConfig, weights_dtype: str) -> int:
    """Weights at `weights_dtype` bytes each (fp32 4, fp16/bf16 2, int8 1, int4 0.5);
    quantization scales are left out (a few percent)."""
    return int(count_parameters(cfg) * dtype_bytes(weights_dtype, WEIGHT_BYTES, "weights dtype"))


@dataclass(frozen=True)
class MemoryPlan:
    kv_bytes_per_token: int
    block_size: int
    num_blocks: int
    weights_bytes: int
    parameters: int

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def max_sequences(self, context_len: int) -> int:
        """Sequences of `context_len` positions that fit at once (whole blocks each)."""
        per_seq = -(-context_len // self.block_size)
        return self.num_blocks // per_seq

    def table(self, contexts: list[int]) -> list[dict[str, int]]:
        return [{"context_len": c, "max_sequences": self.max_sequences(c)} for c in contexts]


def plan_memory(cfg: ModelConfig, kv_cache_bytes: int, kv_dtype: str = "fp32",
                weights_dtype: str = "fp32", block_size: int = 16) -> MemoryPlan:
    per_token = kv_bytes_per_token(cfg, kv_dtype)
    num_blocks = kv_cache_bytes // (per_token * block_size)
    return MemoryPlan(per_token, block_size, int(num_blocks), weight_bytes(cfg, weights_dtype),
                      count_parameters(cfg))


def default_contexts(max_len: int) -> list[int]:
    """256, 512, 1024, ... up to the model's context."""
    out, c = [], 256
    while c < max_len:
        out.append(c)
        c *= 2
    return out + [max_len]
