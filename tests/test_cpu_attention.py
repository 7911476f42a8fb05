"""The CPU attention paths (the cpu backend's C++ kernel, the sdpa backend's pure torch)
agree with the gather-based torch reference."""

from __future__ import annotations

import logging

import pytest
import torch
from tests_support import paged_attention_case

from benchmarks.kernel_reference import paged_decode_attention_ref, paged_prefill_attention_ref
from engine import native
from engine.attention import kv_int8, select_backend
from engine.attention.cpu_backend import CpuAttentionBackend
from engine.attention.sdpa_backend import SdpaAttentionBackend

pytestmark = pytest.mark.usefixtures("isa_cap")  # every kernel under each cap the machine allows




@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", [(9, 3, 64, 16), (4, 4, 128, 32), (8, 1, 64, 16)])
def test_decode_kernel_and_gather_match_reference(heads: int, kv_heads: int, head_dim: int,
                                                   block_size: int) -> None:
    lens = [1, 17, 160, block_size, 3 * block_size + 5]
    q, kv, meta = paged_attention_case(0, lens, [1] * len(lens), heads, kv_heads, head_dim, block_size)
    expected = paged_decode_attention_ref(q, kv, meta.block_tables, meta.seq_lens, 0.125)
    gathered = SdpaAttentionBackend().decode(q, kv, meta, 0.125)
    torch.testing.assert_close(gathered, expected, atol=1e-5, rtol=1e-5)
    if native.paged_attention() is None:
        pytest.skip("no C++ compiler: the kernel path is not built here")
    kernel = CpuAttentionBackend().decode(q, kv, meta, 0.125)
    torch.testing.assert_close(kernel, expected, atol=1e-5, rtol=1e-5)


def test_prefill_over_cached_context_matches_reference() -> None:
    lens, q_lens = [40, 23, 16], [40, 7, 16]  # fresh prompt, chunk over 16 cached, one full block
    q, kv, meta = paged_attention_case(1, lens, q_lens, 9, 3, 64, 16)
    expected = paged_prefill_attention_ref(q, kv, meta.query_start_loc, meta.seq_lens,
                                           meta.block_tables, 0.125)
    ours = CpuAttentionBackend().prefill(q, kv, meta, 0.125)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_over_a_narrow_cache_matches_fp32_reference(dtype: torch.dtype) -> None:
    """An fp16/bf16 cache, converted as read, attends like fp32 over the same (rounded) values."""
    if native.paged_attention() is None:
        pytest.skip("no C++ compiler: the kernel path is not built here")
    lens = [1, 17, 160, 53]
    q, kv, meta = paged_attention_case(2, lens, [1] * len(lens), 9, 3, 64, 16)
    narrow = kv.to(dtype)
    expected = paged_decode_attention_ref(q, narrow.float(), meta.block_tables, meta.seq_lens, 0.125)
    kernel = CpuAttentionBackend().decode(q, narrow, meta, 0.125)
    torch.testing.assert_close(kernel, expected, atol=1e-5, rtol=1e-5)
    gathered = SdpaAttentionBackend().decode(q, narrow, meta, 0.125)
    torch.testing.assert_close(gathered, expected, atol=1e-5, rtol=1e-5)
    # and against the unrounded fp32 cache, within fp16's precision
    full = paged_decode_attention_ref(q, kv, meta.block_tables, meta.seq_lens, 0.125)
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(kernel, full, atol=tol, rtol=tol)


def test_long_prefill_and_extend_chunks_match_reference_across_query_tiles() -> None:
    """Chunks longer than maskless_prefill.TILE, fresh and over cached context: each tile's
    keys-before and diagonal parts are merged by their log-sum-exps."""
    lens, q_lens = [300, 530, 129], [300, 330, 1 + 128]
    q, kv, meta = paged_attention_case(3, lens, q_lens, 9, 3, 64, 16)
    expected = paged_prefill_attention_ref(q, kv, meta.query_start_loc, meta.seq_lens,
                                           meta.block_tables, 0.125)
    ours = CpuAttentionBackend().prefill(q, kv, meta, 0.125)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_prefill_over_an_fp16_cache_matches_reference() -> None:
    lens, q_lens = [40, 23], [40, 7]
    q, kv, meta = paged_attention_case(3, lens, q_lens, 9, 3, 64, 16)
    narrow = kv.half()
    expected = paged_prefill_attention_ref(q, narrow.float(), meta.query_start_loc, meta.seq_lens,
                                           meta.block_tables, 0.125)
    ours = CpuAttentionBackend().prefill(q, narrow, meta, 0.125)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_backends_by_name_and_which_run_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    """cpu uses the C++ kernel where it builds, sdpa never; PAGODE_CPU_KERNEL=0 turns it off."""
    cpu = torch.device("cpu")
    cache = torch.zeros(2, 4, 16, 3, 64, dtype=torch.float16)
    sdpa = select_backend("sdpa", cpu)
    assert isinstance(sdpa, SdpaAttentionBackend) and sdpa.name == "sdpa"
    assert not sdpa.supports_fused_cpu_step(cache)
    cpu_backend = select_backend("cpu", cpu)
    assert isinstance(cpu_backend, CpuAttentionBackend) and cpu_backend.name == "cpu"
    assert cpu_backend.supports_fused_cpu_step(cache) == (native.paged_attention() is not None)
    monkeypatch.setenv("PAGODE_CPU_KERNEL", "0")
    assert not CpuAttentionBackend().supports_fused_cpu_step(cache)
    with pytest.raises(ValueError, match="cpu, sdpa, triton"):
        select_backend("flash", cpu)


def test_the_old_name_torch_is_a_deprecated_alias_of_cpu(caplog: pytest.LogCaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from server.cli import build_parser, engine_config

    cpu = torch.device("cpu")
    with caplog.at_level(logging.WARNING, logger="pagode"):
        backend = select_backend("torch", cpu)
    assert isinstance(backend, CpuAttentionBackend) and backend.name == "cpu"
    assert [r.getMessage() for r in caplog.records] == ["attention backend 'torch' is deprecated; use 'cpu'"]
    monkeypatch.setenv("PAGODE_ATTENTION_BACKEND", "torch")
    assert select_backend(None, cpu).name == "cpu"
    monkeypatch.delenv("PAGODE_ATTENTION_BACKEND")
    assert select_backend(None, cpu).name == "cpu"  # the CPU's default
    args = build_parser().parse_args(["serve", "--attention-backend", "torch"])
    assert select_backend(engine_config(args).attention_backend, cpu).name == "cpu"


def test_rotate_and_write_kv_is_the_same_in_cpp_and_torch() -> None:
    """The cpu backend's fused C++ RoPE + cache write and the interface's torch default
    give the same queries and the same cache, to the bit."""
    if native.paged_attention() is None:
        pytest.skip("no C++ compiler: the kernel path is not built here")
    from engine.model.layers import RotaryEmbedding

    heads, kv_heads, d, tokens = 9, 3, 64, 5
    g = torch.Generator().manual_seed(7)
    rope = RotaryEmbedding(d, 128, 10000.0)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=g)
    positions = torch.randint(0, 128, (tokens,), generator=g)
    slots = torch.randperm(4 * 16, generator=g)[:tokens]
    caches = [torch.zeros(2, 4, 16, kv_heads, d, dtype=torch.float16) for _ in range(2)]
    outs = [backend.rotate_and_write_kv(qkv, positions, rope.cos, rope.sin, cache, slots, heads)
            for backend, cache in zip((CpuAttentionBackend(), SdpaAttentionBackend()), caches, strict=True)]
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(caches[0], caches[1])


WINDOW_CASES = [(None, 30.0), (23, None), (37, 5.0), (1, None)]  # windows not multiples of 16


@pytest.mark.parametrize("window,softcap", WINDOW_CASES)
def test_windowed_softcapped_decode_matches_reference(window: int | None, softcap: float | None) -> None:
    """A sliding window shorter than most contexts and Gemma 2's soft-cap, GQA, in the C++
    kernel (each ISA cap) and the torch gather, against a full masked softmax."""
    lens = [1, 17, 160, 23, 3 * 16 + 5]
    q, kv, meta = paged_attention_case(4, lens, [1] * len(lens), 9, 3, 64, 16)
    q = q * 8  # scores large enough for the cap to bite
    expected = paged_decode_attention_ref(q, kv, meta.block_tables, meta.seq_lens, 0.125, window, softcap)
    assert not torch.allclose(expected, paged_decode_attention_ref(q, kv, meta.block_tables, meta.seq_lens, 0.125))
    gathered = SdpaAttentionBackend().decode(q, kv, meta, 0.125, window=window, softcap=softcap)
    torch.testing.assert_close(gathered, expected, atol=1e-5, rtol=1e-5)
    if native.paged_attention() is None:
        pytest.skip("no C++ compiler: the kernel path is not built here")
    for dtype in (torch.float32, torch.bfloat16):
        narrow = kv.to(dtype)
        expected = paged_decode_attention_ref(q, narrow.float(), meta.block_tables, meta.seq_lens, 0.125,
                                              window, softcap)
        kernel = CpuAttentionBackend().decode(q, narrow, meta, 0.125, window=window, softcap=softcap)
        torch.testing.assert_close(kernel, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window,softcap", WINDOW_CASES)
def test_windowed_softcapped_prefill_over_context_matches_reference(window: int | None,
                                                                    softcap: float | None) -> None:
    """Fresh prompts and chunks over cached context, with decodes in the same step."""
    lens, q_lens = [90, 1, 140, 40, 16], [1, 1, 70, 40, 16]
    q, kv, meta = paged_attention_case(5, lens, q_lens, 8, 2, 64, 16)
    q = q * 8
    expected = paged_prefill_attention_ref(q, kv, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                           0.125, window=window, softcap=softcap)
    for backend in (SdpaAttentionBackend(), CpuAttentionBackend()):
        ours = backend.attend(q, kv, meta, 0.125, window=window, softcap=softcap)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 128), (6, 2, 80), (4, 2, 40)])
@pytest.mark.parametrize("window,softcap", [(None, None), (23, 5.0)])
def test_decode_over_an_int8_cache_matches_the_dequantized_reference(heads: int, kv_heads: int, head_dim: int,
                                                                    window: int | None,
                                                                    softcap: float | None) -> None:
    """--kv-cache-dtype int8: the C++ kernel (each ISA cap; head sizes the avx512 body takes
    and ones it leaves to the avx2 body) and the torch gather read int8 rows and their scales
    as the reference reads the same cache dequantized; and that stays near the fp32 cache."""
    lens = [1, 17, 160, 53]
    q, kv, meta = paged_attention_case(9, lens, [1] * len(lens), heads, kv_heads, head_dim, 16)
    q = q * 4
    int8 = kv_int8.quantize(kv)
    assert int8.dtype == torch.int8 and int8.shape[-1] == head_dim + 4
    expected = paged_decode_attention_ref(q, kv_int8.dequantize(int8), meta.block_tables, meta.seq_lens, 0.125,
                                          window, softcap)
    gathered = SdpaAttentionBackend().decode(q, int8, meta, 0.125, window=window, softcap=softcap)
    torch.testing.assert_close(gathered, expected, atol=1e-5, rtol=1e-5)
    full = paged_decode_attention_ref(q, kv, meta.block_tables, meta.seq_lens, 0.125, window, softcap)
    torch.testing.assert_close(expected, full, atol=0.1, rtol=0.1)  # int8's rounding, no more
    if native.paged_attention() is None:
        pytest.skip("no C++ compiler: the kernel path is not built here")
    kernel = CpuAttentionBackend().decode(q, int8, meta, 0.125, window=window, softcap=softcap)
    torch.testing.assert_close(kernel, expected, atol=1e-5, rtol=1e-5)


def test_prefill_over_an_int8_cache_matches_reference() -> None:
    """Chunks over cached context and a fresh prompt, with decodes in the same step."""
    lens, q_lens = [90, 1, 140, 40], [1, 1, 70, 40]
    q, kv, meta = paged_attention_case(10, lens, q_lens, 8, 2, 64, 16)
    int8 = kv_int8.quantize(kv)
    expected = paged_prefill_attention_ref(q, kv_int8.dequantize(int8), meta.query_start_loc, meta.seq_lens,
                                           meta.block_tables, 0.125)
    for backend in (SdpaAttentionBackend(), CpuAttentionBackend()):
        ours = backend.attend(q, int8, meta, 0.125)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_rotate_and_write_kv_quantizes_the_same_in_cpp_and_torch() -> None:
    """The C++ RoPE + cache write quantizes each (token, KV head) row as the torch path does:
    the same int8 values and the same fp32 scale, to the bit; an all-zero row stores zeros."""
    if native.paged_attention() is None:
        pytest.skip("no C++ compiler: the kernel path is not built here")
    from engine.model.layers import RotaryEmbedding

    heads, kv_heads, d, tokens = 9, 3, 64, 6
    g = torch.Generator().manual_seed(7)
    rope = RotaryEmbedding(d, 128, 10000.0)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=g) * 3
    qkv[0, (heads + kv_heads) * d:(heads + kv_heads + 1) * d] = 0  # the first token's first V row
    positions = torch.randint(0, 128, (tokens,), generator=g)
    slots = torch.randperm(4 * 16, generator=g)[:tokens]
    caches = [torch.zeros(2, 4, 16, kv_heads, d + 4, dtype=torch.int8) for _ in range(2)]
    cpu = CpuAttentionBackend()
    assert cpu.kernel is not None and cpu.kernel.can_rope_write(qkv, caches[0], positions, rope.cos)
    outs = [backend.rotate_and_write_kv(qkv, positions, rope.cos, rope.sin, cache, slots, heads)
            for backend, cache in zip((cpu, SdpaAttentionBackend()), caches, strict=True)]
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(caches[0], caches[1])
    flat = caches[0].view(2, -1, kv_heads, d + 4)
    assert flat[:, slots].count_nonzero() > 0
    assert not flat[1, slots[0], 0].any()  # values and scale all zero
    written = torch.zeros(64, dtype=torch.bool)
    written[slots] = True
    assert not flat[:, ~written].any()
    assert cpu.supports_fused_cpu_step(caches[0])
