"""Which path a CPU prefill/extend chunk takes: the fused C++ kernel
(cpu_kernels/prefill_attention.py) or the maskless path (maskless_prefill.py), by a race.

Why a race: the kernel reads the paged cache in place and shares each K/V row across a
query group, while the maskless path gathers K/V and leans on torch's flash kernel, whose
GEMMs may be the better ones on some CPU, head size or cache dtype. So at load, per
attention shape (heads, KV heads, head size, cache dtype), both run one synthetic chunk of
RACE_CHUNK queries after RACE_CONTEXT cached positions (engine/tuning/prefill_kernel.py times
them and keeps the winner per machine), and the faster one takes every unwindowed, uncapped
chunk of that shape.

Windowed or soft-capped chunks take the kernel wherever it is built: their alternative is
not the maskless path but the masked one, which materialises the whole score matrix.

PAGODE_PREFILL_KERNEL=kernel or =maskless skips the race and pins one path (tests,
benchmarks); `maskless` also sends windowed and capped chunks back to the masked path.

bf16 products. Where the kernel has a bf16 body for the shape (AMX tiles, or AVX512-BF16
dot products) an fp32 or fp16 cache's chunk may take it: queries, K/V and probabilities
rounded to bf16, every sum in fp32. That is the precision of the bf16 big-step GEMM, so a
chunk takes it only when its step is at least `bf16_from` tokens, the size from which the
model's projections run that GEMM already (bf16_from(model); None when none does, as for
an unquantized model, whose greedy tokens are held to transformers' fp32). Such chunks are
raced against the maskless path under a key of their own. A call that holds a short extend
(fewer than BF16_MIN_EXTEND rows: a drafted decode's verification) keeps fp32 products, so
that a drafted row computes what a plain decode computes. PAGODE_PREFILL_BF16=on or =off
pins it (tests, benchmarks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from cpu_kernels.prefill_attention import PrefillAttentionKernel
from engine import envs
from engine.attention import kv_int8
from engine.attention.metadata import AttentionMetadata
from engine.quant.linear import QuantLinear
from engine.tuning import prefill_kernel

log = logging.getLogger("pagode")

# Longer than any drafted decode's verification (its drafts and one), shorter than a prompt's
# chunk worth the bf16 body.
BF16_MIN_EXTEND = 16

RACE_CHUNK = 256  # queries of the raced chunk: half the CPU's default token budget
RACE_CONTEXT = 256  # cached positions before it, so that both the causal and the cached part count

MasklessPath = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, float], torch.Tensor]


def bf16_from(model: nn.Module) -> int | None:
    """The fewest tokens of a step from which every decoder-layer projection that has a bf16
    big-step GEMM runs it (None: none has one). The lm_head is left out: it runs on the
    sampled rows only, not on the step's tokens."""
    limits = [module.max_kernel_tokens + 1 for name, module in model.named_modules()
              if isinstance(module, QuantLinear) and module.gemm is not None and module.gemm.name == "bf16"
              and not name.endswith("lm_head")]
    return max(limits) if limits else None


def wants_bf16(kernel: PrefillAttentionKernel | None, tokens: int, head_dim: int, cache_dtype: torch.dtype,
               from_tokens: int | None, shortest: int | None = None) -> bool:
    """Whether a chunk of `tokens` rows takes the kernel's bf16 products: the kernel has a bf16
    body for this head size and cache that asking changes, the step is as big as the ones
    whose projections run bf16 already, and no sequence in it extends by fewer than
    BF16_MIN_EXTEND rows (`shortest`; or PAGODE_PREFILL_BF16 pins it)."""
    if kernel is None or not kernel.has_bf16_products(head_dim, cache_dtype):
        return False
    pinned = envs.PREFILL_BF16.get()
    if pinned != "auto":
        return pinned == "on"
    return (from_tokens is not None and tokens >= from_tokens
            and (shortest is None or shortest >= BF16_MIN_EXTEND))


def use_kernel(kernel: PrefillAttentionKernel | None, query: torch.Tensor, kv_cache: torch.Tensor,
               masked: bool, maskless: MasklessPath, bf16: bool = False) -> bool:
    """Whether this chunk goes to the kernel; `masked`: it has a window or a soft-cap;
    `maskless`: the other path, raced against the kernel the first time a shape is seen;
    `bf16`: the kernel would run it with bf16 products (raced as such)."""
    if kernel is None or not kernel.supports(query, kv_cache):
        return False
    pinned = envs.PREFILL_KERNEL.get()
    if pinned != "auto":
        return pinned == "kernel"
    if masked:
        return True
    return winner(kernel, maskless, query.shape[1], kv_cache, bf16) == "kernel"


def winner(kernel: PrefillAttentionKernel, maskless: MasklessPath, heads: int, kv_cache: torch.Tensor,
           bf16: bool = False) -> str:
    """'kernel' or 'maskless' for this shape (engine/tuning/prefill_kernel.py races it once)."""
    kv_heads, head_dim = kv_cache.shape[3], kv_int8.head_dim(kv_cache)
    dtype = str(kv_cache.dtype).removeprefix("torch.")
    key = ":".join(map(str, (heads, kv_heads, head_dim, dtype, RACE_CHUNK, RACE_CONTEXT, *(["bf16"] if bf16 else []))))
    return prefill_kernel.winner(
        key, ("kernel", "maskless"),
        lambda: candidates(kernel, maskless, heads, kv_cache.shape[2], kv_heads, head_dim, kv_cache.dtype, bf16),
        f"kernel body: {kernel.body(head_dim, kv_cache.dtype, bf16)}")


def candidates(kernel: PrefillAttentionKernel, maskless: MasklessPath, heads: int, block_size: int, kv_heads: int,
               head_dim: int, dtype: torch.dtype, bf16: bool = False) -> dict[str, Callable[[], object]]:
    """Both paths on one synthetic chunk in a cache of its own."""
    query, cache, meta = synthetic_chunk(heads, kv_heads, head_dim, block_size, dtype)
    scale = head_dim ** -0.5
    return {
        "kernel": lambda: kernel.prefill(query, cache, meta.block_tables, meta.query_start_loc, meta.seq_lens,
                                         scale, bf16=bf16),
        "maskless": lambda: maskless(query, cache, meta, scale),
    }


def synthetic_chunk(heads: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                    chunk: int = RACE_CHUNK, context: int = RACE_CONTEXT,
                    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """One sequence: `chunk` new queries after `context` cached positions, random K/V in a
    cache of its own, stored as the cache's dtype stores rows (an int8 cache quantized, with
    its scales); also benchmarks/bench_attention.py's case."""
    total = context + chunk
    blocks = -(-total // block_size)
    g = torch.Generator().manual_seed(0)
    cache = kv_int8.store(torch.randn(2, blocks, block_size, kv_heads, head_dim, generator=g), dtype)
    query = torch.randn(chunk, heads, head_dim, generator=g)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(chunk, dtype=torch.int64),
        query_start_loc=torch.tensor([0, chunk], dtype=torch.int32),
        seq_lens=torch.tensor([total], dtype=torch.int32),
        block_tables=torch.arange(blocks, dtype=torch.int32)[None], num_decodes=0,
        max_query_len=chunk, max_seq_len=total, query_start_loc_cpu=[0, chunk], seq_lens_cpu=[total])
    return query, cache, meta
