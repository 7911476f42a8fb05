"""KV-cache and weight memory from a model's config alone (no weights are loaded).

The KV bytes per token are the engine's own (engine/runner/kv_cache.py: 2 x layers x kv_heads x
row width x bytes_per_value, an int8 row counting its 4-byte scale), in the dtypes the engine takes and
resolves for the config (`device_dtypes`). The cache holds whole blocks of `block_size`
positions, so the token capacity is rounded down to blocks, and a sequence of C
positions holds ceil(C / block_size) blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import DTYPES, EngineConfig, dtype_name, parse_dtype
from engine.model.config import ModelConfig
from engine.runner.kv_cache import bytes_per_token, kv_cache_dtype, num_blocks_for, resolve_kv_cache_dtype

# Bytes per weight of the block-quantized modes (engine/quant/modes.py), scales left out.
QUANTIZED_WEIGHT_BYTES = {"int8": 1.0, "int4": 0.5}


def device_dtypes(config: EngineConfig) -> tuple[str, str]:
    """(KV dtype, weights dtype) as the engine resolves them for this config's device."""
    from engine.quant.modes import resolve_mode

    device = config.torch_device
    model_dtype = parse_dtype(config.dtype, device)
    kv = dtype_name(resolve_kv_cache_dtype(config.kv_cache_dtype, model_dtype, device))
    mode, _ = resolve_mode(config.quantization, device, model_dtype)
    return kv, dtype_name(model_dtype) if mode == "none" else mode


def kv_bytes_per_token(cfg: ModelConfig, kv_dtype: str) -> int:
    """The engine's KV bytes per token at `kv_dtype` (fp32, fp16, bf16 or int8; 'auto' resolved)."""
    return bytes_per_token(cfg, kv_cache_dtype(kv_dtype))


def count_parameters(cfg: ModelConfig) -> int:
    """Parameters of a Llama-family decoder, from its shapes."""
    h, hd = cfg.hidden_size, cfg.head_dim
    attn = h * cfg.num_attention_heads * hd * 2 + h * cfg.num_key_value_heads * hd * 2
    if cfg.attention_bias:
        attn += (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd
    if cfg.qk_norm == "head":
        attn += 2 * hd
    elif cfg.qk_norm == "proj":
        attn += (cfg.num_attention_heads + cfg.num_key_value_heads) * hd
    layers = sum(attn + mlp_parameters(cfg, i) + 2 * h for i in range(cfg.num_hidden_layers))  # + two RMSNorms
    embed = cfg.vocab_size * h
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * h
    return layers + embed + head + h


def mlp_parameters(cfg: ModelConfig, layer: int) -> int:
    """A dense MLP's, or a sparse layer's every expert (all are resident) and its router."""
    h = cfg.hidden_size
    if cfg.is_sparse_layer(layer):
        return cfg.num_experts * (3 * h * cfg.moe_intermediate_size + h)
    return 3 * h * cfg.intermediate_size


def weight_bytes(cfg: ModelConfig, weights_dtype: str) -> int:
    """Weights at `weights_dtype` bytes each (fp32 4, fp16/bf16 2, int8 1, int4 0.5);
    quantization scales are left out (a few percent)."""
    if weights_dtype in QUANTIZED_WEIGHT_BYTES:
        per_weight = QUANTIZED_WEIGHT_BYTES[weights_dtype]
    elif weights_dtype in DTYPES:
        per_weight = DTYPES[weights_dtype].itemsize
    else:
        raise ValueError(f"unknown weights dtype {weights_dtype!r}; choose from "
                         f"{sorted([*DTYPES, *QUANTIZED_WEIGHT_BYTES])}")
    return int(count_parameters(cfg) * per_weight)


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
    num_blocks = num_blocks_for(kv_cache_bytes, cfg, block_size, kv_cache_dtype(kv_dtype))
    return MemoryPlan(kv_bytes_per_token(cfg, kv_dtype), block_size, num_blocks,
                      weight_bytes(cfg, weights_dtype), count_parameters(cfg))


def default_contexts(max_len: int) -> list[int]:
    """256, 512, 1024, ... up to the model's context."""
    out, c = [], 256
    while c < max_len:
        out.append(c)
        c *= 2
    return out + [max_len]
