"""Run one scheduled step on the model: pack inputs, forward, sample."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from engine import envs
from engine.attention import AttentionMetadata, prefill_choice, select_backend
from engine.config import EngineConfig, parse_dtype
from engine.core.sampling_row import SamplingRow
from engine.core.scheduler import ScheduledSeq
from engine.lora import LoraRegistry, LoraRows
from engine.model import decode_step
from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import ModelSource, load_model
from engine.runner.cuda_graph import CudaGraphRunner, use_cuda_graphs
from engine.runner.kv_cache import allocate_kv_cache, num_blocks_for, resolve_kv_cache_dtype
from engine.runner.kv_populate import KvPopulator
from engine.runner.sampler import SampleResult, sample

log = logging.getLogger("pagode")

LOWEST_PRIORITY = 19  # the nice value of the threads that write a first start's pack and map the KV cache


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_indices: list[int]  # rows of the packed tokens whose logits are sampled
    # (a drafted sequence has 1 + its draft's length rows, in order: engine/spec/)
    seq_starts: list[int]  # [len(scheduled) + 1] each scheduled sequence's first packed row (meta's
    # sequences are attention rows, which a drafted sequence may split into one per token)
    lora: LoraRows | None = None  # which rows run on which adapter; None: every row on the base


def in_background(work: Callable[[], None]) -> None:
    """Run `work` at the lowest CPU priority this thread may take: serializing a pack of
    gigabytes keeps a core busy for tens of seconds, and the first requests, served
    meanwhile, should not share their cores with it. Linux gives each thread a nice value
    of its own; where lowering it is refused, the work runs as it is."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
    work()


class ModelRunner:
    def __init__(self, config: EngineConfig, source: ModelSource, model_config: ModelConfig,
                 max_model_len: int) -> None:
        self.device = config.torch_device
        self.dtype = parse_dtype(config.dtype, self.device)
        self.block_size = config.block_size
        self.logprobs_mode = config.logprobs_mode
        self.model_config = model_config
        self.quantization = config.quantization  # as asked ("auto" resolves alike on one machine)
        self.backend = select_backend(config.attention_backend, self.device)
        # A first start's pack of the weights, written once the engine serves (write_packs).
        self.pending_packs: list[Callable[[], None]] = []
        self.model: LlamaForCausalLM = load_model(source, model_config, self.backend,
                                                  max(max_model_len, 1), self.dtype, self.device,
                                                  config.quantization, config.token_budget,
                                                  pack_later=self.pending_packs)
        self.kv_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, self.dtype, self.device)
        self.num_blocks = num_blocks_for(config.kv_cache_bytes, model_config, self.block_size, self.kv_dtype)
        self.kv_caches = allocate_kv_cache(model_config, self.num_blocks, self.block_size,
                                           self.kv_dtype, self.device)
        self.kv_populator = (KvPopulator(self.kv_caches)
                             if self.device.type == "cpu" and envs.KV_POPULATE.get() else None)
        self.backend.prepare(model_config.num_attention_heads, self.dtype, self.kv_caches[0],
                             bf16_from=prefill_choice.bf16_from(self.model))
        self.graphs: CudaGraphRunner | None = None
        # Decode-only steps of a block-quantized model on the CPU: one C++ call for all layers,
        # which forward() calls instead of the model.
        self.decode_step = (decode_step.build(self.model, self.kv_caches, self.backend, config.max_num_seqs,
                                               config.fused_decode_limit)
                            if self.device.type == "cpu" else None)
        self.lora = (LoraRegistry(self.model, config.max_loras, config.max_lora_rank)
                     if config.enable_lora else None)
        self._loading_thread: int | None = threading.get_ident()  # None once warned

    def write_packs(self) -> list[threading.Thread]:
        """Write a first start's pack in a thread of its own: the load-time races are over (a
        write beside them would skew them), and the server need not wait for the disk. The
        thread is not a daemon, so a server that stops meanwhile finishes the file first."""
        pending, self.pending_packs = self.pending_packs, []
        threads = [threading.Thread(target=in_background, args=(write,), name="pagode-pack-writer")
                   for write in pending]
        for thread in threads:
            thread.start()
        return threads

    def populate_kv_cache(self) -> None:
        """Start mapping the KV cache's next blocks in the background (kv_populate.py): after
        the load-time races, which a thread beside them would skew."""
        if self.kv_populator is not None:
            self.kv_populator.start(in_background)

    def close(self) -> None:
        if self.kv_populator is not None:
            self.kv_populator.close()

    def timed_modules(self) -> Iterator[tuple[str, nn.Module]]:
        """Every module a step may run, by name: the model's, and the fused decode step."""
        yield from self.model.named_modules()
        if self.decode_step is not None:
            yield "decode_step", self.decode_step

    def _check_thread(self) -> None:
        """Warn once if steps run in another thread than the one that loaded the model.

        libgomp gives each thread that opens a parallel region its own pool of workers and,
        once it manages more threads than there are cores, throttles their spin-wait, so
        every region pays a futex wake-up and CPU steps get much slower (docs/speed.md).
        AsyncEngine loads and steps in one thread for this reason."""
        if self._loading_thread is None or threading.get_ident() == self._loading_thread:
            return
        self._loading_thread = None
        if self.device.type == "cpu":
            log.warning("the model runs steps in another thread than the one that loaded it: OpenMP "
                        "keeps a worker pool per thread and CPU steps get slower; load and step in one thread")

    def enable_cuda_graphs(self, config: EngineConfig, max_model_len: int) -> None:
        self.graphs = self._maybe_cuda_graphs(config, max_model_len)

    def _maybe_cuda_graphs(self, config: EngineConfig, max_model_len: int) -> CudaGraphRunner | None:
        """Capture decode steps as CUDA graphs; never on the CPU."""
        # The CPU backends read host-side lengths, which a captured graph would freeze.
        if not use_cuda_graphs(self.device, config.enforce_eager) or self.backend.name != "triton":
            return None
        graphs = CudaGraphRunner(self.model, self.kv_caches, config.max_num_seqs, self.block_size,
                                 max_model_len)
        graphs.capture()
        log.info("captured CUDA graphs for decode batch sizes %s", graphs.sizes)
        return graphs

    # ---- inputs --------------------------------------------------------
    def prepare(self, scheduled: list[ScheduledSeq]) -> StepInputs:
        """Pack the step's tokens: numpy over whole arrays, one Python pass per sequence."""
        n, bs = len(scheduled), self.block_size
        counts = np.fromiter((s.num_new_tokens for s in scheduled), np.int64, n)
        lo = np.fromiter((s.seq.num_computed_tokens for s in scheduled), np.int64, n)
        starts = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        total = int(starts[-1])
        seq_lens = lo + counts
        if total == n:  # decodes only: one token each
            ids = np.fromiter((s.seq.token_ids[s.seq.num_computed_tokens] for s in scheduled), np.int64, n)
            positions, seq_index = lo, np.arange(n)
        else:
            ids = np.fromiter(itertools.chain.from_iterable(
                s.seq.token_ids[s.seq.num_computed_tokens:s.seq.num_computed_tokens + s.num_new_tokens]
                for s in scheduled), np.int64, total)
            seq_index = np.repeat(np.arange(n), counts)
            positions = np.arange(total) + np.repeat(lo - starts[:-1], counts)
        width = max(len(s.seq.block_table) for s in scheduled)
        tables = np.zeros((n, width), np.int32)
        for row, s in enumerate(scheduled):
            tables[row, :len(s.seq.block_table)] = s.seq.block_table
        if self.kv_populator is not None:
            self.kv_populator.reach(int(tables.max()))
        # A block freed out of a sliding window (FREED, -1) is never read; 0 keeps the index valid.
        np.maximum(tables, 0, out=tables)
        slots = tables[seq_index, positions // bs].astype(np.int64) * bs + positions % bs
        completes = np.fromiter((s.completes_prefill for s in scheduled), bool, n)
        sample_indices = _sample_rows(scheduled, starts, completes)
        lora = self._lora_rows(scheduled, counts)  # per sequence, before drafts split them into rows
        seq_starts = starts.tolist()
        drafted = self._drafted_prefix(scheduled)
        if drafted:
            tables, seq_lens, counts, starts = _as_decode_rows(drafted, int(starts[drafted]), tables, seq_lens,
                                                               counts, starts, seq_index, positions)
        num_decodes = int(np.count_nonzero(counts == 1))
        seq_lens_list = seq_lens.tolist()
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots),
            query_start_loc=self._tensor(starts.astype(np.int32)),
            seq_lens=self._tensor(seq_lens.astype(np.int32)),
            block_tables=self._tensor(tables),
            num_decodes=num_decodes,
            max_query_len=int(counts.max()),
            max_seq_len=max(seq_lens_list),
            query_start_loc_cpu=seq_starts if not drafted else starts.tolist(),
            seq_lens_cpu=seq_lens_list,
        )
        return StepInputs(self._tensor(ids), self._tensor(positions), meta, sample_indices, seq_starts, lora)

    def _lora_rows(self, scheduled: list[ScheduledSeq], counts: np.ndarray) -> LoraRows | None:
        """Each packed row's adapter slot, grouped; None when every row runs on the base."""
        if self.lora is None or all(s.seq.lora_name is None for s in scheduled):
            return None
        lora = self.lora
        slots = np.fromiter((lora.slot_of(s.seq.lora_name) for s in scheduled), np.int64, len(scheduled))
        return LoraRows.from_slots(np.repeat(slots, counts), self.device)

    def _drafted_prefix(self, scheduled: list[ScheduledSeq]) -> int:
        """How many leading sequences (the decodes, drafted or not: the scheduler puts them
        first) to lay out as decode rows, one per token; 0 for a step without drafts.

        On the CPU a drafted sequence's positions then run as the decodes do: in the fused
        decode step when the step holds nothing else, or in the C++ decode attention of the
        layer-by-layer path, rather than as an extend chunk that gathers its whole context
        per layer. The GPU paths keep the chunk (one varlen kernel there already)."""
        if self.device.type != "cpu" or not any(s.num_draft for s in scheduled):
            return 0
        return next((i for i, s in enumerate(scheduled) if s.num_new_tokens != 1 + s.num_draft), len(scheduled))

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        return tensor if self.device.type == "cpu" else tensor.to(self.device, non_blocking=True)

    # ---- forward -------------------------------------------------------
    @torch.inference_mode()
    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """Logits [len(sample_indices), vocab] of the tokens that complete their sequence."""
        self._check_thread()
        adapters = self._fused_adapters(inputs)
        if adapters is not None:
            assert self.decode_step is not None
            hidden = self.decode_step(inputs.input_ids, inputs.positions, inputs.meta, adapters)
        elif inputs.lora is not None and self.lora is not None:
            # Other steps with adapter rows: the layer-by-layer path, whose projections add
            # the deltas (the captured graphs read the base weights only).
            with self.lora.applied(inputs.lora):
                hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches)
        elif self.graphs is not None and self.graphs.can_run(inputs.meta):
            hidden = self.graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
        elif self.decode_step is not None and self.decode_step.applies(inputs.meta, len(inputs.input_ids)):
            hidden = self.decode_step(inputs.input_ids, inputs.positions, inputs.meta)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches)
        if not inputs.sample_indices:
            return hidden.new_empty((0, self.model_config.vocab_size), dtype=torch.float32)
        if _every_row_in_order(inputs.sample_indices, hidden.shape[0]):  # e.g. decodes only
            return self.model.compute_logits(hidden)
        index = torch.tensor(inputs.sample_indices, dtype=torch.long, device=hidden.device)
        return self.model.compute_logits(hidden.index_select(0, index))

    def _fused_adapters(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor] | None:
        """For a decode-only step with adapter rows that the fused C++ step can run: the
        projections' adapter tables and each row's slot; None otherwise."""
        if (inputs.lora is None or self.lora is None or self.decode_step is None
                or not self.decode_step.applies(inputs.meta, len(inputs.input_ids))):
            return None
        tables = self.lora.kernel_tables(self.decode_step.projections)
        return None if tables is None else (tables, inputs.lora.slots)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, rows: list[SamplingRow],
               raw_logits: torch.Tensor | None = None) -> SampleResult:
        return sample(logits, rows, self.logprobs_mode, raw_logits)


def _sample_rows(scheduled: list[ScheduledSeq], starts: np.ndarray, completes: np.ndarray) -> list[int]:
    """The last row of each sequence that completes; a drafted one's last 1 + draft rows,
    since the logits after its newest token and after each draft token are all checked."""
    ends = starts[1:]
    if not any(s.num_draft for s in scheduled):
        return (ends[completes] - 1).tolist()
    rows: list[int] = []
    for s, end, done in zip(scheduled, ends.tolist(), completes.tolist(), strict=True):
        if done:
            rows.extend(range(end - 1 - s.num_draft, end))
    return rows


def _as_decode_rows(num_seqs: int, num_tokens: int, tables: np.ndarray, seq_lens: np.ndarray, counts: np.ndarray,
                    starts: np.ndarray, seq_index: np.ndarray,
                    positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The first num_seqs sequences (num_tokens tokens) as one decode row per token: a row
    keeps its sequence's block table and ends at its own position, so attending over it is
    causal attention over the draft, computed as a decode's (engine/attention/metadata.py)."""
    rows = seq_index[:num_tokens]
    return (np.concatenate([tables[rows], tables[num_seqs:]]),
            np.concatenate([positions[:num_tokens] + 1, seq_lens[num_seqs:]]),
            np.concatenate([np.ones(num_tokens, np.int64), counts[num_seqs:]]),
            np.concatenate([np.arange(num_tokens, dtype=np.int64), starts[num_seqs:]]))


def _every_row_in_order(indices: list[int], num_rows: int) -> bool:
    """True when the rows to sample are all the packed rows, in order (no gather needed).
    Prompt-logprob rows are put in front of the sampled ones, so a count alone does not say."""
    return len(indices) == num_rows and indices == list(range(num_rows))
