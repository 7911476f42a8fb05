"""Run one scheduled step on the model: pack inputs, forward, sample."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata, select_backend
from engine.config import EngineConfig, parse_dtype
from engine.cuda_graph import CudaGraphRunner, use_cuda_graphs
from engine.kv_cache import allocate_kv_cache, num_blocks_for
from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import ModelSource, load_model
from engine.sampler import SampleResult, SamplingRow, sample
from engine.scheduler import ScheduledSeq

log = logging.getLogger("pagode")


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_indices: list[int]  # rows of the packed tokens whose logits are sampled


class ModelRunner:
    def __init__(self, config: EngineConfig, source: ModelSource, model_config: ModelConfig,
                 max_model_len: int) -> None:
        self.device = config.torch_device
        self.dtype = parse_dtype(config.dtype, self.device)
        self.block_size = config.block_size
        self.model_config = model_config
        self.backend = select_backend(config.attention_backend, self.device)
        self.model: LlamaForCausalLM = load_model(source, model_config, self.backend,
                                                  max(max_model_len, 1), self.dtype, self.device,
                                                  config.quantization, config.token_budget)
        self.num_blocks = num_blocks_for(config.kv_cache_bytes, model_config, self.block_size, self.dtype)
        self.kv_caches = allocate_kv_cache(model_config, self.num_blocks, self.block_size,
                                           self.dtype, self.device)
        self.graphs: CudaGraphRunner | None = None

    def enable_cuda_graphs(self, config: EngineConfig, max_model_len: int) -> None:
        self.graphs = self._maybe_cuda_graphs(config, max_model_len)

    def _maybe_cuda_graphs(self, config: EngineConfig, max_model_len: int) -> CudaGraphRunner | None:
        """Capture decode steps as CUDA graphs; never on the CPU."""
        # The torch backend reads host-side lengths, which a captured graph would freeze.
        if not use_cuda_graphs(self.device, config.enforce_eager) or self.backend.name != "triton":
            return None
        graphs = CudaGraphRunner(self.model, self.kv_caches, config.max_num_seqs, self.block_size,
                                 max_model_len)
        graphs.capture()
        log.info("captured CUDA graphs for decode batch sizes %s", graphs.sizes)
        return graphs

    # ---- inputs --------------------------------------------------------
    def prepare(self, scheduled: list[ScheduledSeq]) -> StepInputs:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        sample_indices: list[int] = []
        bs = self.block_size
        for s in scheduled:
            seq, lo = s.seq, s.seq.num_computed_tokens
            hi = lo + s.num_new_tokens
            input_ids.extend(seq.token_ids[lo:hi])
            positions.extend(range(lo, hi))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(lo, hi))
            starts.append(starts[-1] + s.num_new_tokens)
            seq_lens.append(hi)
            if s.completes_prefill:
                sample_indices.append(starts[-1] - 1)
        width = max(len(s.seq.block_table) for s in scheduled)
        tables = [s.seq.block_table + [0] * (width - len(s.seq.block_table)) for s in scheduled]
        num_decodes = sum(1 for s in scheduled if s.num_new_tokens == 1)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            num_decodes=num_decodes,
            max_query_len=max(s.num_new_tokens for s in scheduled),
            max_seq_len=max(seq_lens),
            query_start_loc_cpu=starts,
            seq_lens_cpu=seq_lens,
        )
        return StepInputs(torch.tensor(input_ids, dtype=torch.long, device=dev),
                          torch.tensor(positions, dtype=torch.long, device=dev), meta, sample_indices)

    # ---- forward -------------------------------------------------------
    @torch.inference_mode()
    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """Logits [len(sample_indices), vocab] of the tokens that complete their sequence."""
        if self.graphs is not None and self.graphs.can_run(inputs.meta):
            hidden = self.graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches)
        if not inputs.sample_indices:
            return hidden.new_empty((0, self.model_config.vocab_size), dtype=torch.float32)
        index = torch.tensor(inputs.sample_indices, dtype=torch.long, device=hidden.device)
        return self.model.compute_logits(hidden.index_select(0, index))

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
        return sample(logits, rows)
