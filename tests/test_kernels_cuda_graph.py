"""CUDA-graph decode runner: capture sizes and guards here; replay equivalence on a GPU."""

from __future__ import annotations

import pytest
import torch

import cuda_kernels
from engine.attention.metadata import AttentionMetadata
from engine.runner.cuda_graph import CudaGraphRunner, capture_sizes, use_cuda_graphs

gpu = [pytest.mark.gpu,
       pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
       pytest.mark.skipif(not cuda_kernels.triton_available(), reason="triton missing")]


def test_capture_sizes_follow_nano_vllm() -> None:
    assert capture_sizes(256) == [1, 2, 4, 8] + list(range(16, 257, 16))
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]  # every batch size has a graph
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(1) == [1]


def test_cpu_never_builds_graphs() -> None:
    cpu = torch.device("cpu")
    assert not use_cuda_graphs(cpu, enforce_eager=False)
    assert not use_cuda_graphs(torch.device("cuda"), enforce_eager=True)
    with pytest.raises(ValueError, match="CUDA"):
        CudaGraphRunner(lambda *a: a[0], [torch.zeros(2, 1, 16, 1, 8)], 4, 16, 64)


class ToyAttention(torch.nn.Module):
    """Embedding -> QKV -> paged attention through the triton backend, one layer."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        from engine.attention.triton_backend import TritonAttentionBackend

        self.shape = (heads, kv_heads, head_dim)
        self.embed = torch.nn.Embedding(100, heads * head_dim)
        self.qkv = torch.nn.Linear(heads * head_dim, (heads + 2 * kv_heads) * head_dim)
        self.backend = TritonAttentionBackend()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        heads, kv_heads, d = self.shape
        x = self.embed(input_ids) + positions[:, None].float() * 0.01
        q, k, v = self.qkv(x).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        n = input_ids.shape[0]
        out = self.backend.forward(q.view(n, heads, d), k.view(n, kv_heads, d),
                                   v.view(n, kv_heads, d), kv_caches[0], meta, d**-0.5)
        return out.reshape(n, heads * d)


def decode_meta(seq_lens: list[int], tables: torch.Tensor, block_size: int) -> AttentionMetadata:
    dev = tables.device
    slots = [int(tables[b, (n - 1) // block_size]) * block_size + (n - 1) % block_size
             for b, n in enumerate(seq_lens)]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
        query_start_loc=torch.arange(len(seq_lens) + 1, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=tables, num_decodes=len(seq_lens), max_query_len=1,
        max_seq_len=max(seq_lens), query_start_loc_cpu=list(range(len(seq_lens) + 1)),
        seq_lens_cpu=seq_lens)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.skipif(not cuda_kernels.triton_available(), reason="triton missing")
@pytest.mark.parametrize("lens", [[5, 300, 17], [1, 2, 33, 64, 250]], ids=["pad3to4", "pad5to8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replay_matches_eager_decode(lens: list[int], dtype: torch.dtype) -> None:
    """Padded replay gives the eager outputs and cache writes, for lengths unlike capture's."""
    dev, block_size = torch.device("cuda"), 16
    torch.manual_seed(0)
    model = ToyAttention(8, 2, 64).to(dev, dtype)
    cache = torch.randn(2, 128, block_size, 2, 64, device=dev, dtype=dtype)
    tables = torch.randperm(128, device=dev)[: len(lens) * 20].view(len(lens), 20).int()
    runner = CudaGraphRunner(model, [cache], max_num_seqs=8, block_size=block_size,
                             max_model_len=320)
    with torch.inference_mode():
        runner.capture()
        ids = torch.randint(0, 100, (len(lens),), device=dev)
        positions = torch.tensor(lens, device=dev) - 1
        meta = decode_meta(lens, tables, block_size)
        before = cache.clone()
        eager = model(ids, positions, meta, [cache])
        eager_cache = cache.clone()
        cache.copy_(before)
        replayed = runner.run(ids, positions, meta).clone()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert replayed.shape == eager.shape
    torch.testing.assert_close(replayed.float(), eager.float(), atol=tol, rtol=tol)
    # The same slots were written, and padding rows (slot -1) wrote nothing else.
    torch.testing.assert_close(cache.float(), eager_cache.float(), atol=tol, rtol=tol)
