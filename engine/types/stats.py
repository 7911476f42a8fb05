"""Counters and per-step records the server turns into Prometheus metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.types.outputs import RequestTimes
from engine.types.spec_counters import SpecCounters


@dataclass
class EngineStats:
    """A snapshot: gauges now, counters since start."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of blocks held by live requests, 0-1
    num_preemptions_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefix_cache_queries_total: int = 0  # tokens looked up
    prefix_cache_hits_total: int = 0  # tokens found
    num_steps_total: int = 0
    max_concurrent_seqs: int = 0
    # Speculative decoding, vLLM's counters (engine/types/spec_counters.py); None: not speculating.
    spec_decode: SpecCounters | None = None
    # LoRA: most adapters loaded at once (0: adapters off), and the adapters of running and of
    # waiting requests (vLLM's lora_requests_info).
    max_loras: int = 0
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()


@dataclass
class FinishedRequestStats:
    request_id: str
    finish_reason: str
    num_prompt_tokens: int
    num_generation_tokens: int
    times: RequestTimes
    num_cached_tokens: int = 0


@dataclass
class StepStats:
    """One engine iteration."""

    num_tokens: int  # tokens in the forward pass (prefill + decode)
    num_prompt_tokens: int
    num_generation_tokens: int
    num_preemptions: int
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    step_time: float  # seconds of the whole step: schedule, pack, forward, sample, post-process
    finished: list[FinishedRequestStats] = field(default_factory=list)
    # The batch's shape: decode sequences (one token each), prefill-chunk tokens, and the
    # mean context length of the decodes (positions attended per decode token).
    num_decodes: int = 0
    num_prefill_tokens: int = 0
    mean_decode_context: float = 0.0
    # Where the step's time went, in seconds (see engine/observers/profiler.py for the forward's split).
    schedule_time: float = 0.0
    prepare_time: float = 0.0  # packing the step's inputs
    forward_time: float = 0.0  # model forward + logits
    sample_time: float = 0.0
    postprocess_time: float = 0.0  # append, detokenize, stop checks, deltas
    # Each scheduled sequence's (new tokens, tokens computed before this step), for the planner.
    chunks: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)  # request ids preempted in this step
    # Drafts verified in this step (engine/spec/): request-steps drafted, tokens proposed, accepted.
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
