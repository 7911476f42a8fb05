"""CUDA-graph capture and replay of decode steps (nano-vllm style).

A decode step launches hundreds of small kernels; replaying a captured graph removes
their launch overhead. Graphs are captured for a fixed set of batch sizes over static
input buffers; a step of n sequences replays the smallest captured size >= n with its
inputs copied in and the rest padded so that padding writes nothing (slot -1) and
reads one valid position (seq_len 1, block 0).

Everything here needs CUDA: construct a runner only when `use_cuda_graphs()` says so,
so that a CPU run never touches the torch.cuda graph APIs.

Captured kernels must not depend on host values that change per step. The attention
metadata of the capture carries max_seq_len = max_model_len, so the Triton decode
kernel's split count is fixed for the longest context; the kernel divides each
sequence's own length among the splits on the device, so any seq_lens stay correct.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.attention.metadata import AttentionMetadata

Model = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, list[torch.Tensor]], torch.Tensor]


def use_cuda_graphs(device: torch.device, enforce_eager: bool) -> bool:
    return device.type == "cuda" and not enforce_eager


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_num_seqs (plus max_num_seqs itself)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
    sizes += list(range(16, max_num_seqs + 1, 16))
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


class CudaGraphRunner:
    def __init__(self, model: Model, kv_caches: list[torch.Tensor], max_num_seqs: int,
                 block_size: int, max_model_len: int, device: torch.device | None = None) -> None:
        device = device or kv_caches[0].device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        self.model = model
        self.kv_caches = kv_caches
        self.max_model_len = max_model_len
        self.sizes = capture_sizes(max_num_seqs)
        max_bs = self.sizes[-1]
        self.max_blocks = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_bs, self.max_blocks, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.outputs: torch.Tensor | None = None  # sized by the first (eager) forward
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def static_meta(self, bs: int) -> AttentionMetadata:
        """Metadata over the static buffers: the captured kernels read these addresses."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs], query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs], block_tables=self.block_tables[:bs], num_decodes=bs,
            max_query_len=1, max_seq_len=self.max_model_len,
            query_start_loc_cpu=list(range(bs + 1)), seq_lens_cpu=[self.max_model_len] * bs)

    def forward_static(self, bs: int) -> torch.Tensor:
        return self.model(self.input_ids[:bs], self.positions[:bs], self.static_meta(bs),
                          self.kv_caches)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first so smaller graphs reuse its memory pool."""
        pool = None
        for bs in reversed(self.sizes):
            warm = self.forward_static(bs)  # eager warm-up: autotuning, lazy inits
            if self.outputs is None:
                self.outputs = torch.empty((self.sizes[-1], *warm.shape[1:]), dtype=warm.dtype,
                                           device=warm.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                # Into one shared buffer: graph outputs in the shared pool could alias.
                self.outputs[:bs] = self.forward_static(bs)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def can_run(self, meta: AttentionMetadata) -> bool:
        return (bool(self.graphs) and meta.num_prefills == 0
                and 0 < meta.num_decodes <= self.sizes[-1]
                and meta.block_tables.shape[1] <= self.max_blocks)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor:
        """hidden [n, hidden_size] for a decode step of n sequences; valid until the next run."""
        n = meta.num_decodes
        bs = next(s for s in self.sizes if s >= n)
        width = meta.block_tables.shape[1]
        self.input_ids[:n] = input_ids
        self.positions[:n] = positions
        self.slot_mapping[:n] = meta.slot_mapping
        self.seq_lens[:n] = meta.seq_lens
        # Columns past `width` may hold stale ids; the kernels never read past seq_len.
        self.block_tables[:n, :width] = meta.block_tables
        self.slot_mapping[n:bs] = -1
        self.seq_lens[n:bs] = 1
        self.block_tables[n:bs] = 0
        self.graphs[bs].replay()
        assert self.outputs is not None
        return self.outputs[:n]
