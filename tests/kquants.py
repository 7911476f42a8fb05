"""Q4_K and Q6_K quantizers in numpy, with llama.cpp's block layouts (ggml-common.h), because
gguf-py can read K-quants but not write them.

Both cut a row into 256-element super-blocks. Q4_K: 8 sub-blocks of 32, each with a 6-bit
scale and a 6-bit min under the super-block's fp16 d and dmin; w = d * sc * q - dmin * m with
q in 0..15 (144 bytes: d, dmin, 12 packed scale/min bytes, 128 nibble bytes). Q6_K: 16
sub-blocks of 16, each with an int8 scale under one fp16 d; w = d * sc * (q - 32) with q in
0..63 (210 bytes: 128 low-nibble bytes, 64 bytes of high 2-bit pairs, 16 scales, d).

Each quantizer returns the bytes and the values it means them to stand for, computed from
the quantized integers here; tests/test_kquants.py checks those against gguf-py's
dequantize, so the packing is checked against llama.cpp's reader, not against itself.
The rounding is plain nearest (llama.cpp searches scales to cut the error): the tests need
the format, not the best 4-bit weights.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _super_blocks(w: np.ndarray) -> np.ndarray:
    assert w.ndim == 2 and w.shape[1] % QK_K == 0, "K-quants need rows that are a multiple of 256"
    return w.astype(np.float32).reshape(-1, QK_K)


def quantize_q4_k(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [rows, row bytes], fp32 [rows, cols] the bytes stand for)."""
    x = _super_blocks(w)
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    lo = np.minimum(sub.min(-1), 0.0)  # the min is subtracted as a non-negative m, as llama.cpp
    scale, mins = (sub.max(-1) - lo) / 15.0, -lo
    d, dmin = _f16(scale.max(-1) / 63.0), _f16(mins.max(-1) / 63.0)
    sc = _ratio(scale, d.astype(np.float32)[:, None], 63)
    m = _ratio(mins, dmin.astype(np.float32)[:, None], 63)
    step = d.astype(np.float32)[:, None] * sc  # [n, 8]
    offset = dmin.astype(np.float32)[:, None] * m
    q = np.clip(np.rint(_safe_div(sub + offset[..., None], step[..., None])), 0, 15).astype(np.uint8)
    values = (step[..., None] * q - offset[..., None]).reshape(w.shape)
    halves = q.reshape(n, 4, 2, 32)  # 64 elements per 32 bytes: low nibbles first, then high
    qs = (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n, 128)
    blocks = np.concatenate([d.reshape(n, 1).view(np.uint8), dmin.reshape(n, 1).view(np.uint8),
                             _pack_scale_min(sc, m), qs], axis=1)
    return blocks.reshape(w.shape[0], -1), values.astype(np.float32)


def _pack_scale_min(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins in 12 bytes: bytes 0-3 hold sc 0-3 and the top bits of sc 4-7,
    bytes 4-7 the same for the mins, bytes 8-11 the low nibbles of sc 4-7 and m 4-7."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    first = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    second = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    third = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return np.concatenate([first, second, third], axis=1)


def quantize_q6_k(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [rows, row bytes], fp32 [rows, cols] the bytes stand for)."""
    x = _super_blocks(w)
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    scale = np.abs(sub).max(-1) / 31.0
    d = _f16(scale.max(-1) / 127.0)
    sc = _ratio(scale, d.astype(np.float32)[:, None], 127).astype(np.int8)
    step = d.astype(np.float32)[:, None] * sc
    q = (np.clip(np.rint(_safe_div(sub, step[..., None])), -32, 31) + 32).astype(np.uint8)
    values = (step[..., None] * (q.astype(np.float32) - 32)).reshape(w.shape)
    flat = q.reshape(n, QK_K)
    low = (flat & 0x0F).reshape(n, 2, 2, 64)  # per 128 elements: 64 bytes, low nibbles first
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(n, 128)
    high = (flat >> 4).reshape(n, 2, 4, 32)  # per 128 elements: 32 bytes of four 2-bit pairs
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n, 64)
    blocks = np.concatenate([ql, qh, sc.view(np.uint8), d.reshape(n, 1).view(np.uint8)], axis=1)
    return blocks.reshape(w.shape[0], -1), values.astype(np.float32)


def _ratio(x: np.ndarray, unit: np.ndarray, top: int) -> np.ndarray:
    """round(x / unit) in 0..top, 0 where the unit is 0 (an all-zero super-block)."""
    return np.clip(np.rint(_safe_div(x, unit)), 0, top)


def _safe_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.divide(x, y, out=np.zeros_like(x, dtype=np.float32), where=y != 0)


QUANTIZERS = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}


def q4_k_m_kind(name: str, layer: int, layers: int) -> str:
    """llama.cpp's Q4_K_M mix (llama-quant.cpp): Q6_K for the output and for attn_v and ffn_down
    in the first and last eighth of the layers and every third layer between (its
    use_more_bits), Q4_K for the rest."""
    if name == "output.weight":
        return "Q6_K"
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        eighth = layers // 8
        if layer < eighth or layer >= 7 * layers // 8 or (layer - eighth) % 3 == 2:
            return "Q6_K"
    return "Q4_K"
