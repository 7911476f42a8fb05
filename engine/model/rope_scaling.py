"""RoPE inverse frequencies and the cos/sin factor for each scaling kind, in transformers'
arithmetic (`modeling_rope_utils._compute_*_parameters`), so tables match bit for bit.

A table is built once for every position the engine serves; kinds whose frequencies
transformers changes with the sequence length are served where one table equals its
behaviour, and refused with the reason elsewhere.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SCALINGS = ("linear", "llama3", "yarn", "dynamic", "longrope", "freq_factors")


def default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def inv_freq_and_factor(dim: int, theta: float, scaling: dict[str, Any] | None, max_positions: int,
                        max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [dim/2], factor on cos and sin) for a table of `max_positions`."""
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if scaling is None or kind == "default":
        return default_inv_freq(dim, theta), 1.0
    if kind == "linear":
        return default_inv_freq(dim, theta) / scaling["factor"], 1.0
    if kind == "llama3":
        return llama3_inv_freq(default_inv_freq(dim, theta), scaling), 1.0
    if kind == "yarn":
        return yarn_inv_freq(dim, theta, scaling, max_position_embeddings)
    if kind == "dynamic":
        return dynamic_inv_freq(dim, theta, max_positions, max_position_embeddings), 1.0
    if kind == "longrope":
        return longrope_inv_freq(dim, theta, scaling, max_positions, max_position_embeddings)
    if kind == "freq_factors":  # GGUF's rope_freqs: per-dimension divisors baked by the converter
        return default_inv_freq(dim, theta) / torch.tensor(scaling["factors"], dtype=torch.float32), 1.0
    raise ValueError(f"unsupported rope scaling {kind!r}; pagode serves {('default', *SCALINGS[:-1])}")


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling.get("original_max_position_embeddings", 8192)
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_mid, mid, scaled)


def yarn_inv_freq(dim: int, theta: float, scaling: dict[str, Any],
                  max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the low frequencies, extrapolate the high ones, ramp between."""
    orig = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or max_position_embeddings / orig
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
                            if mscale and mscale_all_dim else _yarn_mscale(factor))
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1
    low = _correction_dim(beta_fast, dim, theta, orig)
    high = _correction_dim(beta_slow, dim, theta, orig)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attention_factor)


def _yarn_mscale(scale: float, mscale: float = 1) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _correction_dim(rotations: float, dim: int, theta: float, orig: int) -> float:
    return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(theta))


def dynamic_inv_freq(dim: int, theta: float, max_positions: int, max_position_embeddings: int) -> torch.Tensor:
    """Dynamic NTK equals plain RoPE up to max_position_embeddings; beyond, transformers
    recomputes the base per forward pass from the sequence's current length (and keys already
    cached keep their old rotation), which no single table reproduces."""
    if max_positions > max_position_embeddings:
        raise ValueError(
            f"rope_type 'dynamic' is served only up to max_position_embeddings ({max_position_embeddings}) "
            f"tokens, where it equals plain RoPE; beyond it transformers changes the frequencies with each "
            f"sequence's length. Pass --max-model-len {max_position_embeddings} or less (asked: {max_positions})")
    return default_inv_freq(dim, theta)


def longrope_inv_freq(dim: int, theta: float, scaling: dict[str, Any], max_positions: int,
                      max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """Phi-3's LongRoPE. transformers picks the long factors for a whole forward pass once the
    sequence outgrows original_max_position_embeddings; one table must pick once, so, as vLLM
    and llama.cpp do, the long factors serve every position when the engine's context exceeds
    the original one, and the short factors otherwise."""
    orig = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or max_position_embeddings / orig
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = scaling["long_factor"] if max_positions > orig else scaling["short_factor"]
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (torch.tensor(ext, dtype=torch.float32) * theta ** shape), float(attention_factor)
