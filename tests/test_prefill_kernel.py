"""The fused prefill/extend kernel (cpu_kernels/prefill_attention.py) agrees with a float64
torch reference over the gathered cache (an int8 cache's rows dequantized as the torch path
dequantizes them), under each ISA cap the machine allows, its bf16 products (AMX tiles,
AVX512-BF16) to within their rounding; the cpu backend routes chunks to it or to the
maskless path as raced or pinned, with bf16 products only for chunks as big as the steps
whose projections run bf16 GEMMs, and the race result is kept for the next start, for each
cache dtype under its own key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests_support import SHARED_PREFIX, cache_sharing_builds, paged_attention_case
from torch import nn

from benchmarks.kernel_reference import paged_decode_attention_ref, paged_prefill_attention_ref
from cpu_kernels.prefill_attention import BF16_BODIES, PrefillAttentionKernel
from engine import LLM, SamplingParams, envs, native
from engine.attention import kv_int8, prefill_choice
from engine.attention.cpu_backend import CpuAttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.quant.bf16_gemm import Bf16Gemm
from engine.quant.dense_gemm import DenseGemm
from engine.quant.formats import quantize
from engine.quant.linear import QuantLinear
from engine.runner.kv_cache import kv_cache_dtype
from engine.tuning import prefill_kernel, race_memory, timing

# Fresh prompts (context 0) and extends after a cached prefix, with chunk lengths that are
# not multiples of any tile (1, 7, 37, 40), a chunk crossing many blocks, one 100 long.
LENS, CHUNKS = [40, 23, 31, 100, 537], [40, 7, 1, 100, 37]
# heads, KV heads, head size, block size: GQA 3 (SmolLM2), 1, 3 at 128, 8
SHAPES = [(9, 3, 64, 16), (4, 4, 128, 32), (12, 4, 128, 16), (8, 1, 64, 16)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8]
SCALE = 0.125


def kernel() -> PrefillAttentionKernel:
    found = native.prefill_attention()
    if found is None:
        pytest.skip("no C++ compiler or a CPU below AVX2: the kernel is not built here")
    return found


def case(seed: int, lens: list[int], chunks: list[int], heads: int, kv_heads: int, head_dim: int,
         block_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Every chunk as a prefill, a chunk of one included; the cache stores its rows as `dtype`
    does (int8: quantized, each row with its scale)."""
    q, kv, meta = paged_attention_case(seed, lens, chunks, heads, kv_heads, head_dim, block_size, num_decodes=0)
    return q, kv_int8.store(kv, dtype), meta


def expected_body(cap: str, dtype: torch.dtype, bf16: bool = False) -> str:
    """int8 rows are dequantized to fp32 and take the fp32 body at every level; a bf16 cache
    takes the bf16 products from avx512 on, an fp32 or fp16 one when asked."""
    if cap == "avx2":
        return "avx2 fp32"
    if dtype == torch.bfloat16 or (bf16 and dtype in (torch.float32, torch.float16)):
        return "amx bf16 tiles" if cap == "amx" else "avx512 bf16 dot products"
    return "avx512 fp32"


def reference(q: torch.Tensor, kv: torch.Tensor, meta: AttentionMetadata, body: str | None,
              window: int | None = None, softcap: float | None = None) -> tuple[torch.Tensor, float]:
    """float64 attention over the cache's own (rounded) values, and the tolerance of `body`.

    The bf16 bodies round the queries, K/V (a bf16 cache's already are) and the
    probabilities to bf16: they are compared with queries and K/V rounded alike, to within
    the probabilities' rounding. An int8 cache is read as its fp32 dequantization (the
    kernel's numbers exactly), widened to float64."""
    bf16 = body in BF16_BODIES
    queries = (q.bfloat16() if bf16 else q).double()
    values = kv_int8.widen(kv.bfloat16() if bf16 else kv, torch.float64)
    out = paged_prefill_attention_ref(queries, values, meta.query_start_loc, meta.seq_lens,
                                      meta.block_tables, SCALE, window=window, softcap=softcap)
    return out.float(), (1e-2 if bf16 else 1e-5)


@pytest.mark.usefixtures("isa_cap")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_matches_float64_reference(shape: tuple[int, int, int, int], dtype: torch.dtype,
                                          isa_cap: str) -> None:
    k = kernel()
    q, kv, meta = case(0, LENS, CHUNKS, *shape, dtype)
    body = k.body(shape[2], dtype)
    assert body == expected_body(isa_cap, dtype)
    expected, tol = reference(q, kv, meta, body)
    got = k.prefill(q, kv, meta.block_tables, meta.query_start_loc, meta.seq_lens, SCALE)
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.usefixtures("isa_cap")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,window,softcap", [((9, 3, 64, 16), 50, None), ((4, 4, 128, 32), None, 5.0),
                                                  ((9, 3, 64, 16), 17, 30.0)], ids=str)
def test_window_and_softcap_match_reference(shape: tuple[int, int, int, int], window: int | None,
                                            softcap: float | None, dtype: torch.dtype) -> None:
    k = kernel()
    q, kv, meta = case(1, LENS, CHUNKS, *shape, dtype)
    expected, tol = reference(q, kv, meta, k.body(shape[2], dtype), window, softcap)
    got = k.prefill(q, kv, meta.block_tables, meta.query_start_loc, meta.seq_lens, SCALE, window=window,
                    softcap=softcap)
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.usefixtures("isa_cap")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_lone_chunk_on_few_tasks_matches_reference(dtype: torch.dtype) -> None:
    """Too few tasks for the threads: the kernel cuts the chunk into its smaller query tiles."""
    k = kernel()
    q, kv, meta = case(3, [80], [50], 8, 1, 64, 16, dtype)
    expected, tol = reference(q, kv, meta, k.body(64, dtype))
    got = k.prefill(q, kv, meta.block_tables, meta.query_start_loc, meta.seq_lens, SCALE)
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


# Qwen3 1.7B's attention (16 heads on 8 KV heads of 128) beside the shapes above.
BF16_SHAPES = [*SHAPES, (16, 8, 128, 16)]


@pytest.mark.usefixtures("isa_cap")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", BF16_SHAPES, ids=str)
@pytest.mark.parametrize("window,softcap", [(None, None), (50, None), (None, 5.0)], ids=str)
def test_bf16_products_match_reference(shape: tuple[int, int, int, int], dtype: torch.dtype,
                                       window: int | None, softcap: float | None, isa_cap: str) -> None:
    """Asked for bf16, an fp32 or fp16 cache takes the bf16 products where the build has them
    (AMX tiles on amx, vdpbf16ps on avx512; avx2 and an int8 cache keep fp32): within 1e-2 of
    the float64 reference on the same rounded queries and K/V, and within 3e-2 of the exact
    one, on unit-variance queries and K/V (scores up to ~4), odd chunk lengths, several
    sequences, cached positions, GQA 1 to 8, windows and soft-caps."""
    k = kernel()
    q, kv, meta = case(5, LENS, CHUNKS, *shape, dtype)
    body = k.body(shape[2], dtype, bf16=True)
    assert body == expected_body(isa_cap, dtype, bf16=True)
    got = k.prefill(q, kv, meta.block_tables, meta.query_start_loc, meta.seq_lens, SCALE, window=window,
                    softcap=softcap, bf16=True)
    expected, tol = reference(q, kv, meta, body, window, softcap)
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    exact, _ = reference(q, kv, meta, None, window, softcap)
    torch.testing.assert_close(got, exact, atol=max(tol, 3e-2), rtol=0)


@pytest.mark.usefixtures("isa_cap")
def test_bf16_products_on_a_long_chunk_after_a_long_context(isa_cap: str) -> None:
    """A prefill of Qwen3 1.7B's shape as the server runs it: 512 new tokens after 488 cached
    ones, two sequences, so every query tile walks many key tiles and the online softmax
    rescales often; the same bounds as above."""
    k = kernel()
    q, kv, meta = case(6, [1000, 300], [512, 300], 16, 8, 128, 16, torch.float16)
    body = k.body(128, torch.float16, bf16=True)
    got = k.prefill(q, kv, meta.block_tables, meta.query_start_loc, meta.seq_lens, SCALE, bf16=True)
    expected, tol = reference(q, kv, meta, body)
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    exact, _ = reference(q, kv, meta, None)
    torch.testing.assert_close(got, exact, atol=max(tol, 3e-2), rtol=0)


@pytest.mark.usefixtures("isa_cap")
@pytest.mark.parametrize("head_dim", [40, 80])
def test_int8_rows_of_other_head_sizes_match_reference(head_dim: int) -> None:
    """Head sizes the avx512 body leaves to the avx2 one (40) or takes (80): an int8 row's
    scale sits at a stride that is no multiple of any vector, windowed and capped."""
    k = kernel()
    q, kv, meta = case(4, LENS, CHUNKS, 6, 2, head_dim, 16, torch.int8)
    expected, tol = reference(q, kv, meta, k.body(head_dim, torch.int8), 45, 20.0)
    got = k.prefill(q, kv, meta.block_tables, meta.query_start_loc, meta.seq_lens, SCALE, window=45, softcap=20.0)
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8], ids=str)
@pytest.mark.parametrize("path", ["kernel", "maskless"])
def test_the_backend_attends_decodes_and_chunks_by_either_path(path: str, dtype: torch.dtype,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A step packs decodes first, then chunks: the backend hands the kernel only the chunks."""
    kernel()
    monkeypatch.setenv("PAGODE_PREFILL_KERNEL", path)
    lens, chunks = [17, 160, *LENS], [1, 1, *CHUNKS]
    q, kv, meta = case(2, lens, chunks, 9, 3, 64, 16, dtype)
    meta.num_decodes = 2
    backend = CpuAttentionBackend()
    assert prefill_choice.use_kernel(backend.prefill_kernel, q, kv, False, backend.prefill_maskless) == (
        path == "kernel")
    got = backend.attend(q, kv, meta, SCALE)
    values = kv_int8.widen(kv, torch.float32)
    decodes = paged_decode_attention_ref(q[:2], values, meta.block_tables[:2], meta.seq_lens[:2], SCALE)
    prefills = paged_prefill_attention_ref(q, values, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                           SCALE)
    torch.testing.assert_close(got[:2], decodes, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[2:], prefills[2:], atol=1e-5, rtol=1e-5)


def projection(gemm: Bf16Gemm | DenseGemm | None, kernel_up_to: int) -> QuantLinear:
    """A 64 x 64 Q8_0 projection whose block kernel takes steps of up to `kernel_up_to`
    tokens and `gemm` the bigger ones."""
    return QuantLinear(quantize(torch.randn(64, 64), "q8_0"), gemm, None, kernel_up_to)


def test_bf16_from_is_where_every_bf16_projection_runs_its_gemm() -> None:
    """The fewest tokens of a step from which each decoder-layer projection that has a bf16
    GEMM runs it (the largest of their crossovers, plus one); the lm_head (sampled rows
    only), fp32 GEMMs and kernel-only layers do not count; no bf16 GEMM at all: None."""
    w = torch.randn(64, 64)
    layers = nn.ModuleList([nn.ModuleDict({"qkv": projection(Bf16Gemm(w), 16), "down": projection(Bf16Gemm(w), 48),
                                           "o": projection(DenseGemm(w), 100), "up": projection(None, 1 << 30)})])
    model = nn.ModuleDict({"layers": layers, "lm_head": projection(Bf16Gemm(w), 500)})
    assert prefill_choice.bf16_from(model) == 49
    fp32_only = nn.ModuleDict({"layers": nn.ModuleList([projection(DenseGemm(w), 8)]),
                               "lm_head": projection(Bf16Gemm(w), 8)})
    assert prefill_choice.bf16_from(fp32_only) is None
    assert prefill_choice.bf16_from(nn.Sequential(nn.Linear(64, 64))) is None


def bf16_kernel(head_dim: int = 64) -> PrefillAttentionKernel:
    k = kernel()
    if not k.has_bf16_products(head_dim, torch.float16):
        pytest.skip("no bf16 products in this build (a CPU below avx512)")
    return k


def test_the_backend_takes_bf16_products_in_steps_from_bf16_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """With bf16_from 64, a step's 47 chunk rows stay fp32 and its 137 take the bf16 products
    (each output equal to the kernel's own with or without them), but not 135 rows of which a
    sequence extends by 5; bf16_from None (no bf16
    GEMM) never takes them; PAGODE_PREFILL_BF16=on and =off pin them."""
    k = bf16_kernel()
    monkeypatch.setenv("PAGODE_PREFILL_KERNEL", "kernel")
    monkeypatch.delenv("PAGODE_PREFILL_BF16", raising=False)

    def attended(backend: CpuAttentionBackend, chunks: list[int], lens: tuple[int, int] = (60, 80)
                 ) -> tuple[bool, bool]:
        """Whether the backend's output is the kernel's fp32 one, and whether its bf16 one."""
        q, kv, meta = case(7, list(lens), chunks, 9, 3, 64, 16, torch.float16)
        got = backend.attend(q, kv, meta, SCALE)
        args = (q, kv, meta.block_tables, meta.query_start_loc, meta.seq_lens, SCALE)
        return torch.equal(got, k.prefill(*args)), torch.equal(got, k.prefill(*args, bf16=True))

    backend = CpuAttentionBackend()
    backend.prepare(9, torch.float32, torch.zeros(2, 8, 16, 3, 64, dtype=torch.float16), bf16_from=64)
    assert attended(backend, [7, 40]) == (True, False)
    assert attended(backend, [60, 77]) == (False, True)
    # A short extend beside a big chunk (a drafted decode's verification) keeps the whole call fp32.
    assert attended(backend, [130, 5], (140, 80)) == (True, False)
    backend.prepare(9, torch.float32, torch.zeros(2, 8, 16, 3, 64, dtype=torch.float16), bf16_from=None)
    assert attended(backend, [60, 77]) == (True, False)
    monkeypatch.setenv("PAGODE_PREFILL_BF16", "on")
    assert attended(backend, [7, 40]) == (False, True)
    monkeypatch.setenv("PAGODE_PREFILL_BF16", "off")
    backend.prepare(9, torch.float32, torch.zeros(2, 8, 16, 3, 64, dtype=torch.float16), bf16_from=64)
    assert attended(backend, [60, 77]) == (True, False)


def test_bf16_chunks_are_raced_under_their_own_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose big steps run bf16 GEMMs races the kernel twice at load: its fp32 body
    and its bf16 products, each against the maskless path, kept under keys of their own."""
    bf16_kernel()
    monkeypatch.setenv("PAGODE_CACHE_DIR", str(cache_sharing_builds(tmp_path / "cache", envs.CACHE_DIR.get())))
    for name in ("PAGODE_PREFILL_KERNEL", "PAGODE_PREFILL_BF16", "PAGODE_RACE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(race_memory, "_fresh", False)
    monkeypatch.setattr(prefill_kernel, "_winners", {})
    bodies: list[bool] = []
    run = PrefillAttentionKernel.prefill

    def noted(self: PrefillAttentionKernel, *args: object, bf16: bool = False, **kwargs: object) -> torch.Tensor:
        bodies.append(bf16)
        return run(self, *args, bf16=bf16, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PrefillAttentionKernel, "prefill", noted)
    CpuAttentionBackend().prepare(9, torch.float32, torch.zeros(2, 8, 16, 3, 64, dtype=torch.float16), bf16_from=64)
    assert set(bodies) == {False, True}
    key = f"9:3:64:float16:{prefill_choice.RACE_CHUNK}:{prefill_choice.RACE_CONTEXT}"
    assert race_memory.recall("prefill-attention", key) in ("kernel", "maskless")
    assert race_memory.recall("prefill-attention", key + ":bf16") in ("kernel", "maskless")


@pytest.mark.parametrize("dtype", [torch.float16, torch.int8], ids=str)
def test_the_race_runs_once_and_is_kept(dtype: torch.dtype, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Raced at load for the model's shape and cache dtype (an int8 cache under its own key,
    at its head size, not its row width), kept, and read back at the next start."""
    kernel()
    monkeypatch.setenv("PAGODE_CACHE_DIR", str(cache_sharing_builds(tmp_path / "cache", envs.CACHE_DIR.get())))
    monkeypatch.delenv("PAGODE_PREFILL_KERNEL", raising=False)
    monkeypatch.delenv("PAGODE_RACE_CACHE", raising=False)
    monkeypatch.setattr(race_memory, "_fresh", False)
    monkeypatch.setattr(prefill_kernel, "_winners", {})
    raced: list[dict[str, float]] = []
    fastest = timing.fastest

    def counted(*args: object, **kwargs: object) -> tuple[str, dict[str, float]]:
        name, times = fastest(*args, **kwargs)  # type: ignore[arg-type]
        raced.append(times)
        return name, times

    monkeypatch.setattr(timing, "fastest", counted)
    cache = torch.zeros(2, 8, 16, 3, kv_int8.row_width(64, dtype), dtype=dtype)
    backend = CpuAttentionBackend()
    backend.prepare(9, torch.float32, cache)
    assert len(raced) == 1 and set(raced[0]) == {"kernel", "maskless"}
    won = min(raced[0], key=lambda name: raced[0][name])
    name = str(dtype).removeprefix("torch.")
    key = f"9:3:64:{name}:{prefill_choice.RACE_CHUNK}:{prefill_choice.RACE_CONTEXT}"
    assert race_memory.recall("prefill-attention", key) == won
    q = torch.empty(0, 9, 64)
    assert prefill_choice.use_kernel(backend.prefill_kernel, q, cache, False, backend.prefill_maskless) == (
        won == "kernel")
    # windowed or capped chunks take the kernel whatever the race said; maskless pins them off it
    assert prefill_choice.use_kernel(backend.prefill_kernel, q, cache, True, backend.prefill_maskless)
    monkeypatch.setenv("PAGODE_PREFILL_KERNEL", "maskless")
    assert not prefill_choice.use_kernel(backend.prefill_kernel, q, cache, True, backend.prefill_maskless)
    monkeypatch.delenv("PAGODE_PREFILL_KERNEL")
    monkeypatch.setattr(prefill_kernel, "_winners", {})  # a later start: read back, not raced
    CpuAttentionBackend().prepare(9, torch.float32, cache)
    assert len(raced) == 1
    assert prefill_kernel._winners[key] == won


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype,logprob_tol", [("fp16", 1e-2), ("int8", 0.25)])
def test_the_default_model_prefills_alike_on_either_path(kv_dtype: str, logprob_tol: float,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The default model with the fp16 cache (the CPU default) or the int8 one, a prompt read
    in chunks that extend cached positions: the kernel and the maskless path give the same
    greedy tokens, and prompt logprobs within the cache's rounding. Both paths read the same
    dequantized K/V, but they sum in different orders (tiles with an online softmax against
    torch's flash kernel), and a last-bit difference in one layer's output can round a later
    layer's K/V to a neighbouring fp16 value, or one int8 step away. An int8 step is about
    1% of a row's largest value (fp16's is 2^-11 of the value), and such flips compound over
    the layers, so int8's prompt logprobs are held to a wider bound (the int8 cache's own
    distance from the fp32 cache's is larger still); the greedy tokens are held exactly."""
    kernel()
    calls: list[int] = []
    run = PrefillAttentionKernel.prefill

    def counted(self: PrefillAttentionKernel, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return run(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PrefillAttentionKernel, "prefill", counted)
    llm = LLM(kv_cache_memory="64MiB", max_model_len=512, max_num_batched_tokens=32, kv_cache_dtype=kv_dtype,
              quantization="none")
    assert llm.engine.runner.kv_caches[0].dtype == kv_cache_dtype(kv_dtype)
    params = SamplingParams(temperature=0, max_tokens=16, prompt_logprobs=0)
    prompt = SHARED_PREFIX + "Summarize it."
    seen = {}
    for path in ("maskless", "kernel"):
        monkeypatch.setenv("PAGODE_PREFILL_KERNEL", path)
        calls.clear()
        out = llm.generate(prompt, params)[0]
        assert bool(calls) == (path == "kernel")
        assert out.prompt_logprobs is not None and len(out.prompt_token_ids) > 2 * 32
        seen[path] = (torch.tensor([lp.logprob for lp in out.prompt_logprobs[1:]]), out.token_ids)  # type: ignore[union-attr]
    torch.testing.assert_close(seen["kernel"][0], seen["maskless"][0], atol=logprob_tol, rtol=0)
    assert seen["kernel"][1] == seen["maskless"][1]
