"""Triton paged-attention kernels against the gather-based torch oracle.

Without CUDA the kernels run under Triton's interpreter on CPU tensors; with CUDA
they are compiled and run natively (and the CPU variants are skipped). The
interpreter is chosen when cuda_kernels' kernel modules are first imported, which
happens inside the tests, after the environment variable below is set; importing
`cuda_kernels` itself does not import triton.

Tolerances (max abs error vs the fp32 oracle, cast to the input dtype):
fp32 1e-4, fp16 2e-3 (+2e-3 relative), bf16 1.6e-2 (+1.6e-2 relative): about
one unit in the last place of outputs of magnitude 1-2 for the half types.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cuda_kernels
from benchmarks.kernel_reference import (
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    reshape_and_cache_ref,
)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

needs_triton = pytest.mark.skipif(not cuda_kernels.triton_available(), reason="triton missing")
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="with CUDA the kernels are compiled for the GPU")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")]),
]
TOL = {torch.float32: (1e-4, 0.0), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    atol, rtol = TOL[out.dtype]
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), atol=atol, rtol=rtol)


def scattered_cache(seq_lens: list[int], kv_heads: int, head_dim: int, block_size: int,
                    dtype: torch.dtype, device: str,
                    gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random cache (junk in unused slots too) and block tables over shuffled block ids."""
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + 3
    ids = torch.randperm(num_blocks, generator=gen)
    # One spare column: the kernels must stop at seq_len, not at the table's width.
    tables = torch.zeros(len(seq_lens), max(needed) + 1, dtype=torch.int32)
    used = 0
    for row, n in enumerate(needed):
        tables[row, :n] = ids[used : used + n]
        used += n
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=gen)
    return cache.to(device=device, dtype=dtype), tables.to(device)


def lengths_with_random(fixed: list[int], gen: torch.Generator) -> list[int]:
    return fixed + [int(torch.randint(2, 150, (1,), generator=gen))]


# (kv_heads, query heads per kv head, head_dim, block_size, dtype, fixed seq lens, num_splits)
DECODE_CASES = [
    (2, 1, 64, 16, F32, [1, 17, 40], 1),
    (1, 2, 128, 16, F32, [16, 32], None),
    (2, 3, 64, 16, F16, [95], 2),
    (3, 4, 64, 32, F32, [300, 1, 47], 4),  # split-K; short sequences leave splits empty
    (1, 5, 64, 32, F32, [129, 3], 1),
    (2, 6, 128, 32, F32, [7, 250], 2),
    (2, 7, 128, 16, F16, [200, 31, 2], 3),
    (1, 8, 64, 16, F16, [1, 1, 80], 1),
    (1, 9, 128, 32, F16, [33, 5, 64], 1),
    (2, 4, 64, 16, BF16, [70, 1], 2),  # the CUDA default dtype
]


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", DECODE_CASES,
                         ids=lambda c: f"kvh{c[0]}-g{c[1]}-d{c[2]}-bs{c[3]}-{str(c[4])[6:]}-s{c[6]}")
def test_paged_decode_matches_reference(device: str, case: tuple) -> None:
    kv_heads, group, head_dim, block_size, dtype, fixed, num_splits = case
    gen = torch.Generator().manual_seed(sum(fixed) + group)
    lens = lengths_with_random(fixed, gen)
    cache, tables = scattered_cache(lens, kv_heads, head_dim, block_size, dtype, device, gen)
    query = torch.randn(len(lens), kv_heads * group, head_dim, generator=gen).to(device, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    out = cuda_kernels.paged_decode_attention(query, cache, tables, seq_lens, scale,
                                              num_splits=num_splits)
    assert_close(out, paged_decode_attention_ref(query, cache, tables, seq_lens, scale))


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_decode_splits_agree_and_read_strided_query(device: str) -> None:
    """The split count changes only rounding; a strided query view (as sliced from a
    fused QKV projection) is read in place."""
    gen = torch.Generator().manual_seed(7)
    lens = [1, 129, 400]
    cache, tables = scattered_cache(lens, 2, 64, 16, F32, device, gen)
    fused = torch.randn(3, 12, 64, generator=gen).to(device)
    query = fused[:, :6]  # 6 heads of 12: a non-contiguous view
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    outs = [cuda_kernels.paged_decode_attention(query, cache, tables, seq_lens, 0.125,
                                                num_splits=s) for s in (1, 3, 8)]
    ref = paged_decode_attention_ref(query, cache, tables, seq_lens, 0.125)
    for out in outs:
        assert_close(out, ref)


# (kv_heads, group, head_dim, block_size, dtype, [(new tokens, cached tokens) per sequence])
PREFILL_CASES = [
    (2, 1, 64, 16, F32, [(5, 0), (1, 20), (33, 15)]),
    (3, 2, 64, 16, F16, [(10, 5)]),
    (1, 3, 128, 16, F16, [(1, 0), (17, 17)]),
    (2, 4, 64, 32, F32, [(70, 0), (3, 64)]),  # 280 rows: several row tiles
    (1, 5, 64, 16, F32, [(30, 0), (4, 30)]),  # 150 rows: a token straddles row tiles
    (1, 6, 128, 32, F32, [(9, 9)]),
    (2, 7, 64, 32, F16, [(15, 50)]),
    (1, 8, 64, 16, F32, [(16, 16), (2, 0)]),
    (1, 9, 128, 32, F16, [(20, 0), (7, 40)]),
    (2, 2, 64, 16, BF16, [(19, 13)]),
]


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: f"kvh{c[0]}-g{c[1]}-d{c[2]}-bs{c[3]}-{str(c[4])[6:]}")
def test_paged_prefill_matches_reference(device: str, case: tuple) -> None:
    """As the engine calls it: the chunk's K/V are first written by reshape_and_cache."""
    kv_heads, group, head_dim, block_size, dtype, chunks = case
    gen = torch.Generator().manual_seed(len(chunks) * 100 + group)
    lens = [new + cached for new, cached in chunks]
    cache, tables = scattered_cache(lens, kv_heads, head_dim, block_size, dtype, device, gen)
    total = sum(new for new, _ in chunks)
    key, value = (torch.randn(total, kv_heads, head_dim, generator=gen).to(device, dtype)
                  for _ in range(2))
    slots = [int(tables[b, p // block_size]) * block_size + p % block_size
             for b, (new, cached) in enumerate(chunks) for p in range(cached, cached + new)]
    cuda_kernels.reshape_and_cache(key, value, cache,
                                   torch.tensor(slots, dtype=torch.long, device=device))
    query = torch.randn(total, kv_heads * group, head_dim, generator=gen).to(device, dtype)
    starts = [0]
    for new, _ in chunks:
        starts.append(starts[-1] + new)
    cu = torch.tensor(starts, dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    max_q = max(new for new, _ in chunks)
    scale = head_dim**-0.5
    out = cuda_kernels.paged_prefill_attention(query, cache, cu, seq_lens, tables, scale, max_q)
    assert_close(out, paged_prefill_attention_ref(query, cache, cu, seq_lens, tables, scale))


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("head_dim", "block_size", "dtype"),
                         [(64, 16, F32), (128, 32, F16), (64, 32, BF16)])
def test_reshape_and_cache_matches_reference(device: str, head_dim: int, block_size: int,
                                             dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(head_dim + block_size)
    kv_heads, num_blocks, tokens = 3, 6, 9
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=gen)
    cache = cache.to(device, dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[[2, 5]] = -1  # padding tokens: nothing may be written for them
    key, value = (torch.randn(tokens, kv_heads, head_dim, generator=gen).to(device, dtype)
                  for _ in range(2))
    expected = cache.clone()
    reshape_and_cache_ref(key, value, expected, slots.to(device))
    cuda_kernels.reshape_and_cache(key, value, cache, slots.to(device))
    assert torch.equal(cache, expected)
    flat = cache.view(2, -1, kv_heads, head_dim)
    written = slots[slots >= 0].to(device)
    assert torch.equal(flat[0, written], key[slots.to(device) >= 0])


@needs_triton
def test_cpu_tensors_without_interpreter_fail_clearly() -> None:
    """Compiled kernels cannot take CPU tensors; say how to get the interpreter."""
    if cuda_kernels.is_interpreted():
        pytest.skip("kernels are interpreted in this process")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        cuda_kernels.paged_decode_attention(torch.randn(1, 2, 64), torch.randn(2, 1, 16, 2, 64),
                                            torch.zeros(1, 1, dtype=torch.int32),
                                            torch.ones(1, dtype=torch.int32), 0.125)


@needs_triton
@pytest.mark.slow
def test_kernels_compile_for_hopper_without_a_gpu() -> None:
    """The interpreter skips compiled-only rules (tl.dot minimum sizes, types); compile
    the kernels for sm_90 with triton's bundled ptxas, in a process without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.compile_check", "--quick"],
                          env=env, cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(" ok: ") == 10  # five kernel variants, over an fp16 cache and an int8 one
    assert proc.stdout.count("cache   i8 ok: ") == 5


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the kernels are compiled")
def test_triton_backend_refuses_a_cpu_that_did_not_choose_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine leaves the process's environment alone: the interpreter is the caller's choice."""
    from engine.attention.triton_backend import TritonAttentionBackend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        TritonAttentionBackend()
    assert "TRITON_INTERPRET" not in os.environ


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_triton_backend_matches_cpu_backend_on_a_mixed_step(device: str) -> None:
    """Two decodes then two prefill chunks in one step, through the engine's interface."""
    from engine.attention.cpu_backend import CpuAttentionBackend
    from engine.attention.metadata import AttentionMetadata
    from engine.attention.triton_backend import TritonAttentionBackend

    gen = torch.Generator().manual_seed(11)
    kv_heads, group, head_dim, block_size = 2, 3, 64, 16
    new = [1, 1, 20, 7]
    lens = [33, 5, 20, 47]  # the last chunk extends 40 cached positions
    cache, tables = scattered_cache(lens, kv_heads, head_dim, block_size, F32, device, gen)
    slots = [int(tables[b, p // block_size]) * block_size + p % block_size
             for b, (n, total) in enumerate(zip(new, lens, strict=True))
             for p in range(total - n, total)]
    starts = [0, 1, 2, 22, 29]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device), block_tables=tables,
        num_decodes=2, max_query_len=20, max_seq_len=47, query_start_loc_cpu=starts,
        seq_lens_cpu=lens)
    q, k, v = (torch.randn(29, h, head_dim, generator=gen).to(device)
               for h in (kv_heads * group, kv_heads, kv_heads))
    cpu_cache = cache.clone()
    expected = CpuAttentionBackend().forward(q, k, v, cpu_cache, meta, 0.125)
    out = TritonAttentionBackend().forward(q, k, v, cache, meta, 0.125)
    assert_close(out, expected)
    assert torch.equal(cache, cpu_cache)


def run_kernel_bench(*args: str) -> subprocess.CompletedProcess[str]:
    """`make bench-kernels` as a program, compiled (no interpreter) where a GPU is present."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "benchmarks.bench_kernels", *args], env=env,
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_kernel_bench_without_gpu_reports_no_gpu_number(tmp_path: Path) -> None:
    rows_path = tmp_path / "rows.json"
    proc = run_kernel_bench("--shapes", "2:40", "--heads", "4", "--kv-heads", "2", "--head-dim", "64",
                            "--json", str(rows_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "No CUDA GPU present" in proc.stdout and "CPU (torch reference only" in proc.stdout
    assert "peak" not in proc.stdout and "triton ms" not in proc.stdout
    [row] = json.loads(rows_path.read_text())
    assert (row["device"], row["batch"], row["context"], row["triton_ms"]) == ("cpu", 2, 40, None)
    # K and V of 2 x 40 positions x 2 heads x 64 dims, and the queries (2 x 4 heads x 64), in fp32
    assert row["bytes_read"] == 2 * 80 * 2 * 64 * 4 + 2 * 4 * 64 * 4
    assert row["ref_ms"] > 0


@needs_triton
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_bench_times_the_triton_kernel_on_a_gpu(tmp_path: Path) -> None:
    rows_path = tmp_path / "rows.json"
    proc = run_kernel_bench("--shapes", "4:512,2:1000", "--iters", "3", "--json", str(rows_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"device: {torch.cuda.get_device_name()}; peak" in proc.stdout
    rows = json.loads(rows_path.read_text())
    assert [(r["device"], r["batch"], r["context"]) for r in rows] == [("cuda", 4, 512), ("cuda", 2, 1000)]
    for row in rows:
        assert row["triton_ms"] > 0 and row["triton_1split_ms"] > 0 and row["ref_ms"] > 0
        assert row["num_splits"] >= 1


def test_kernel_bench_refuses_bad_shapes() -> None:
    proc = run_kernel_bench("--shapes", "4x512")
    assert proc.returncode == 2 and "--shapes wants BATCH:CONTEXT" in proc.stderr


# ---- the oracle itself, against torch's SDPA on contiguous K/V (no triton needed) ----

def test_reference_decode_matches_sdpa() -> None:
    gen = torch.Generator().manual_seed(3)
    lens, kv_heads, group, head_dim = [1, 23, 40], 2, 3, 64
    cache, tables = scattered_cache(lens, kv_heads, head_dim, 16, F32, "cpu", gen)
    query = torch.randn(3, kv_heads * group, head_dim, generator=gen)
    out = paged_decode_attention_ref(query, cache, tables, torch.tensor(lens), 0.125)
    for b, n in enumerate(lens):
        pos = torch.arange(n)
        blocks = tables[b].long()[pos // 16]
        k = cache[0, blocks, pos % 16].repeat_interleave(group, 1).transpose(0, 1)
        v = cache[1, blocks, pos % 16].repeat_interleave(group, 1).transpose(0, 1)
        sdpa = torch.nn.functional.scaled_dot_product_attention(query[b][:, None], k, v,
                                                                scale=0.125)
        torch.testing.assert_close(out[b], sdpa[:, 0], atol=1e-5, rtol=1e-5)


def test_reference_prefill_matches_sdpa_causal_suffix() -> None:
    """A chunk on top of a cache equals the last rows of causal attention over it all."""
    gen = torch.Generator().manual_seed(4)
    new, cached, kv_heads, group, head_dim = 6, 10, 1, 2, 64
    cache, tables = scattered_cache([new + cached], kv_heads, head_dim, 16, F32, "cpu", gen)
    full_q = torch.randn(new + cached, kv_heads * group, head_dim, generator=gen)
    out = paged_prefill_attention_ref(full_q[cached:], cache, torch.tensor([0, new]),
                                      torch.tensor([new + cached]), tables, 0.125)
    pos = torch.arange(new + cached)
    blocks = tables[0].long()[pos // 16]
    k = cache[0, blocks, pos % 16].repeat_interleave(group, 1).transpose(0, 1)
    v = cache[1, blocks, pos % 16].repeat_interleave(group, 1).transpose(0, 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention(full_q.transpose(0, 1), k, v,
                                                            is_causal=True, scale=0.125)
    torch.testing.assert_close(out, sdpa.transpose(0, 1)[cached:], atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("query_dtype", "cache_dtype"), [(F32, F16), (BF16, F16), (F32, BF16)])
def test_kernels_take_a_cache_of_another_dtype(device: str, query_dtype: torch.dtype,
                                               cache_dtype: torch.dtype) -> None:
    """--kv-cache-dtype: the cache is written and read in its own dtype, cast on load."""
    kv_heads, group, head_dim, block_size = 3, 3, 64, 16
    gen = torch.Generator().manual_seed(7)
    chunks = [(6, 20), (1, 40)]
    lens = [new + cached for new, cached in chunks]
    cache, tables = scattered_cache(lens, kv_heads, head_dim, block_size, cache_dtype, device, gen)
    total = sum(new for new, _ in chunks)
    key, value = (torch.randn(total, kv_heads, head_dim, generator=gen).to(device, query_dtype)
                  for _ in range(2))
    slots = torch.tensor([int(tables[b, p // block_size]) * block_size + p % block_size
                          for b, (new, cached) in enumerate(chunks) for p in range(cached, cached + new)],
                         dtype=torch.long, device=device)
    expected = cache.clone()
    reshape_and_cache_ref(key, value, expected, slots)
    cuda_kernels.reshape_and_cache(key, value, cache, slots)
    assert cache.dtype == cache_dtype
    ulp = torch.finfo(cache_dtype).eps  # the cast may round either way by one unit
    torch.testing.assert_close(cache.float(), expected.float(), atol=0, rtol=ulp)
    query = torch.randn(total, kv_heads * group, head_dim, generator=gen).to(device, query_dtype)
    cu = torch.tensor([0, 6, 7], dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    # The oracle reads the same rounded cache values, widened to the query's dtype.
    widened = cache.to(query_dtype)
    out = cuda_kernels.paged_prefill_attention(query, cache, cu, seq_lens, tables, scale, 6)
    assert_close(out, paged_prefill_attention_ref(query, widened, cu, seq_lens, tables, scale))
    decode_q = query[[6]]
    out = cuda_kernels.paged_decode_attention(decode_q, cache, tables[1:], seq_lens[1:], scale, num_splits=2)
    assert_close(out, paged_decode_attention_ref(decode_q, widened, tables[1:], seq_lens[1:], scale))



@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("query_dtype", [F32, BF16])
def test_kernels_write_and_read_an_int8_cache(device: str, query_dtype: torch.dtype) -> None:
    """--kv-cache-dtype int8: the Triton cache write stores the same bytes (values and each
    row's scale) as the torch path, and decode and prefill over that cache match the oracle
    reading the dequantized rows, with a window and a soft-cap on the decode."""
    from engine.attention import kv_int8
    from engine.attention.sdpa_backend import SdpaAttentionBackend

    kv_heads, group, head_dim, block_size = 3, 3, 64, 16
    gen = torch.Generator().manual_seed(8)
    chunks = [(6, 20), (1, 40)]
    lens = [new + cached for new, cached in chunks]
    floats, tables = scattered_cache(lens, kv_heads, head_dim, block_size, F32, "cpu", gen)
    cache = kv_int8.quantize(floats).to(device)
    tables = tables.to(device)
    assert cache.shape[-1] == head_dim + kv_int8.SCALE_BYTES
    total = sum(new for new, _ in chunks)
    key, value = (torch.randn(total, kv_heads, head_dim, generator=gen).to(device, query_dtype)
                  for _ in range(2))
    key[0, 1] = 0  # an all-zero row: scale 0, values 0
    slots = torch.tensor([int(tables[b, p // block_size]) * block_size + p % block_size
                          for b, (new, cached) in enumerate(chunks) for p in range(cached, cached + new)],
                         dtype=torch.long, device=device)
    expected = cache.cpu().clone()
    SdpaAttentionBackend().write_kv(key.cpu(), value.cpu(), expected, slots.cpu())
    cuda_kernels.reshape_and_cache(key, value, cache, slots)
    assert torch.equal(cache.cpu(), expected)
    query = torch.randn(total, kv_heads * group, head_dim, generator=gen).to(device, query_dtype)
    cu = torch.tensor([0, 6, 7], dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    out = cuda_kernels.paged_prefill_attention(query, cache, cu, seq_lens, tables, scale, 6)
    assert_close(out, paged_prefill_attention_ref(query, cache, cu, seq_lens, tables, scale))
    decode_q = query[[6]] * 8
    out = cuda_kernels.paged_decode_attention(decode_q, cache, tables[1:], seq_lens[1:], scale, num_splits=2,
                                              window=23, softcap=5.0)
    assert_close(out, paged_decode_attention_ref(decode_q, cache, tables[1:], seq_lens[1:], scale, 23, 5.0))

# (window, softcap): windows shorter than most contexts and not multiples of the block
WINDOW_CASES = [(23, None), (37, 5.0), (None, 5.0), (1, None)]


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("window", "softcap"), WINDOW_CASES)
def test_windowed_softcapped_decode_matches_reference(device: str, window: int | None,
                                                      softcap: float | None) -> None:
    """GQA, split and unsplit: a split whose tiles all precede the window stays empty."""
    gen = torch.Generator().manual_seed(11)
    lens = [1, 23, 150, 300]
    cache, tables = scattered_cache(lens, 2, 64, 16, F32, device, gen)
    query = (8 * torch.randn(len(lens), 6, 64, generator=gen)).to(device)  # large scores: the cap bites
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    ref = paged_decode_attention_ref(query, cache, tables, seq_lens, 0.125, window, softcap)
    assert not torch.allclose(ref, paged_decode_attention_ref(query, cache, tables, seq_lens, 0.125))
    for splits in (1, 4):
        out = cuda_kernels.paged_decode_attention(query, cache, tables, seq_lens, 0.125,
                                                  num_splits=splits, window=window, softcap=softcap)
        assert_close(out, ref)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("window", "softcap"), WINDOW_CASES)
def test_windowed_softcapped_prefill_matches_reference(device: str, window: int | None,
                                                       softcap: float | None) -> None:
    """Fresh chunks and chunks over cached context, several row tiles, GQA."""
    gen = torch.Generator().manual_seed(12)
    chunks = [(40, 0), (3, 70), (70, 30)]  # (new, cached)
    lens = [new + cached for new, cached in chunks]
    cache, tables = scattered_cache(lens, 2, 64, 16, F32, device, gen)
    starts = [0]
    for new, _ in chunks:
        starts.append(starts[-1] + new)
    query = (8 * torch.randn(starts[-1], 4, 64, generator=gen)).to(device)
    cu = torch.tensor(starts, dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = cuda_kernels.paged_prefill_attention(query, cache, cu, seq_lens, tables, 0.125, 70,
                                               window=window, softcap=softcap)
    assert_close(out, paged_prefill_attention_ref(query, cache, cu, seq_lens, tables, 0.125,
                                                  window=window, softcap=softcap))
