"""The synchronous engine: add requests, run steps, hand back deltas."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import torch

from engine import native
from engine.config import EngineConfig, dtype_name
from engine.core.block_manager import BlockManager
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.request_state import RequestState
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.executor import Executor
from engine.lora import LoraError, LoraRegistry
from engine.lora.sources import read_adapter
from engine.model.layers import kv_window
from engine.model.loader import load_tokenizer, read_config, resolve_model
from engine.observers.kv_events import KVEventRecorder
from engine.observers.kv_publisher import ZmqEventPublisher
from engine.observers.profiler import StepProfiler
from engine.observers.stats_recorder import StatsRecorder
from engine.output_processor import OutputProcessor
from engine.request_limits import RequestLimits, check_request
from engine.runner.heap import keep_freed_memory
from engine.runner.kv_cache import bytes_per_block
from engine.runner.model_runner import ModelRunner
from engine.runner.synthetic_steps import RunnerSteps
from engine.sampling_params import SamplingParams
from engine.spec.drafter import Drafter
from engine.structured_output import StructuredOutputManager
from engine.thinking_budget import ThinkingTracker
from engine.tokenizer import Tokenizer
from engine.tuning import race_memory
from engine.tuning.tuning import tune
from engine.types.errors import InvalidRequestError
from engine.types.info import EngineInfo
from engine.types.outputs import RequestTimes, StreamDelta
from engine.types.stats import EngineStats, StepStats

log = logging.getLogger("pagode")

DEFAULT_MAX_MODEL_LEN_CAP = 2048  # max_model_len when none is given: the model's, capped


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        torch.manual_seed(config.seed)
        race_memory.race_again(config.warmup)
        self.cpu = native.cpu_target()
        log.info("CPU: %s", self.cpu.describe())
        self.source = resolve_model(config.model)
        self.model_name = self.source.name
        self.model_config = read_config(self.source)
        self.tokenizer: Tokenizer = load_tokenizer(self.source)
        requested_len = config.max_model_len or self.model_config.max_position_embeddings
        self.runner = ModelRunner(config, self.source, self.model_config, requested_len)
        if self.runner.device.type == "cpu":  # the weights and KV cache are in place: steps from here on
            keep_freed_memory()
        self.num_blocks = self.runner.num_blocks
        for name, path in (config.lora_modules or {}).items():
            self.load_lora_adapter(name, path)
        self.block_size = config.block_size
        self.max_model_len = self._fit_max_model_len(config.max_model_len)
        self.tuning = tune(RunnerSteps(self.runner, self.model_name), config)
        self.config = config = dataclasses.replace(config, max_num_seqs=self.tuning.max_num_seqs(config.max_num_seqs))
        self.runner.enable_cuda_graphs(config, self.max_model_len)
        self.block_manager = BlockManager(self.num_blocks, self.block_size, config.enable_prefix_caching,
                                          window=kv_window(self.runner.model))
        self.kv_events, self.kv_publisher = self._build_kv_events(config)
        self.scheduler = Scheduler(config, self.block_manager, self.max_model_len, self._build_drafter(config))
        self.limits = self._build_limits()
        self.requests: dict[str, RequestState] = {}
        self.eos_ids = frozenset(self.model_config.eos_token_ids) | (
            frozenset([self.tokenizer.eos_token_id]) if self.tokenizer.eos_token_id is not None else frozenset())
        self.recorder = StatsRecorder(self.scheduler, self.block_manager)
        self.step_listeners: list[Callable[[StepStats], None]] = self.recorder.listeners
        self.structured = StructuredOutputManager(self.tokenizer, self.model_config.vocab_size,
                                                  sorted(self.eos_ids))
        self.outputs = OutputProcessor(self.tokenizer, self.requests)
        self.executor = Executor(self.runner, self.structured, self.requests, config.logprobs_mode,
                                 self.outputs.token_text)
        log.info("KV cache: %d blocks of %d positions = %d tokens in %s (%s, %d tokens per GiB; "
                 "weights %s, %s), batching %s, max_model_len %d",
                 self.num_blocks, self.block_size, self.num_blocks * self.block_size,
                 config.kv_cache_memory, dtype_name(self.runner.kv_dtype), self.kv_tokens_per_gib,
                 self.runner.dtype, self.runner.device, config.batching, self.max_model_len)
        self.runner.write_packs()
        self.runner.populate_kv_cache()

    def _fit_max_model_len(self, requested: int | None) -> int:
        capacity = self.num_blocks * self.block_size
        model_max = self.model_config.max_position_embeddings
        if requested is None:
            return min(model_max, capacity, DEFAULT_MAX_MODEL_LEN_CAP)
        if requested > capacity:
            raise ValueError(f"max_model_len {requested} needs {requested} KV positions but the cache "
                             f"holds {capacity}; raise kv_cache_memory or lower max_model_len")
        return requested

    # ---- requests ------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt).input_ids)
        return list(prompt)

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival_time: float | None = None, lora_name: str | None = None) -> Sequence:
        """`lora_name`: the loaded adapter the request runs on (None: the base model)."""
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        cache_root = self._lora_cache_root(lora_name)
        token_ids = self.tokenize(prompt)
        max_tokens = self.validate(token_ids, params)
        seq = Sequence(request_id, token_ids, params, RequestTimes(arrival_time or time.monotonic()))
        seq.lora_name, seq.cache_root = lora_name, cache_root
        generator = None
        if params.seed is not None and not params.greedy:
            generator = torch.Generator(device=self.runner.device).manual_seed(params.seed)
        grammar = self.structured.new_state(params.structured_outputs)
        detok = IncrementalDetokenizer(self.tokenizer, token_ids, params.stop, params.skip_special_tokens)
        state = self.requests[request_id] = RequestState(seq, detok, generator, max_tokens,
                                                         self.eos_ids, grammar)
        if params.thinking_budget is not None:
            state.thinking = ThinkingTracker(params.thinking_budget)
        if params.prompt_logprobs is not None:  # see engine/runner/prompt_logprobs.py
            state.prompt_logprobs, seq.skip_prefix_cache = [None], True
        self.scheduler.add(seq)
        return seq

    # ---- LoRA adapters ---------------------------------------------------
    def _lora_registry(self) -> LoraRegistry:
        if self.runner.lora is None:
            raise LoraError("this engine serves no adapters (start it with enable_lora / --enable-lora)")
        return self.runner.lora

    def _lora_cache_root(self, lora_name: str | None) -> int | None:
        """The root of the request's block hashes: its adapter's load id (None on the base)."""
        if lora_name is None:
            return None
        ids = self.runner.lora.cache_ids if self.runner.lora is not None else {}
        if lora_name not in ids:
            raise InvalidRequestError(f"The model `{lora_name}` does not exist.", "model")
        return ids[lora_name]

    def lora_adapters(self) -> dict[str, str]:
        """The loaded adapters: name -> folder."""
        lora = self.runner.lora
        return {} if lora is None else {name: a.path for name, a in lora.adapters.items()}

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Read an adapter (a PEFT folder or a GGUF LoRA) and attach it; LoraError (nothing
        attached) when it cannot be served."""
        registry = self._lora_registry()
        if name in registry.adapters:
            raise LoraError(f"the adapter `{name}` is already loaded")
        registry.add(read_adapter(name, path, registry.max_lora_rank, self.model_config))

    def unload_lora_adapter(self, name: str) -> None:
        """Detach an adapter; refused while a request runs or waits on it."""
        registry = self._lora_registry()
        if name not in registry.adapters:
            raise LoraError(f"the adapter `{name}` is not loaded")
        if any(state.seq.lora_name == name for state in self.requests.values()):
            raise LoraError(f"the adapter `{name}` has requests running; unload it when they end")
        registry.remove(name)

    def lora_requests(self) -> tuple[list[str], list[str]]:
        """(adapters of running requests, adapters of waiting ones): vLLM's lora_requests_info."""
        running = {s.lora_name for s in self.scheduler.running if s.lora_name is not None}
        waiting = {s.lora_name for s in self.scheduler.waiting if s.lora_name is not None}
        return sorted(running), sorted(waiting)

    def _build_limits(self) -> RequestLimits:
        """The one source of the limits that the server and add_request check."""
        # Ids must index the embedding table and decode with the tokenizer.
        vocab = min(self.model_config.vocab_size, len(self.tokenizer))
        return RequestLimits(vocab, self.max_model_len, self.scheduler.max_prompt_tokens,
                             self.config.request_caps)

    def validate(self, token_ids: list[int], params: SamplingParams) -> int:
        """Check what can never be served; return the effective max_tokens."""
        return check_request(token_ids, params, self.limits)

    def _build_kv_events(self, config: EngineConfig) -> tuple[KVEventRecorder | None, ZmqEventPublisher | None]:
        """The prefix cache's observer and its publisher, when --kv-events-config enables them."""
        if config.kv_events_config is None or not config.kv_events_config.publishes:
            return None, None
        medium = "GPU" if self.runner.device.type == "cuda" else "CPU"
        recorder = KVEventRecorder(self.block_size, medium, config.kv_events_config.event_layout,
                                   lora_paths=self.lora_adapters)
        publisher = ZmqEventPublisher(config.kv_events_config)
        self.block_manager.observer = recorder
        return recorder, publisher

    def _publish_kv_events(self) -> None:
        """This step's events, as one batch (none when nothing changed, as vLLM does)."""
        if self.kv_events is not None and self.kv_publisher is not None:
            events = self.kv_events.take_events()
            if events:
                self.kv_publisher.publish(events)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix block (the KV events say AllBlocksCleared)."""
        self.block_manager.reset_prefix_cache()
        self._publish_kv_events()

    def close(self) -> None:
        """Release what outlives a step: the KV-event publisher's thread and sockets, the KV
        cache's populating thread."""
        self.runner.close()
        if self.kv_publisher is not None:
            self.kv_publisher.shutdown()
            self.kv_publisher = None

    def _build_drafter(self, config: EngineConfig) -> Drafter | None:
        """The drafter, with this machine's step cost curve (measured by tune), when the engine speculates."""
        if config.speculative_config is None or self.tuning.step_cost is None:
            return None
        return Drafter(config.speculative_config, self.max_model_len, self.tuning.step_cost)

    def abort_request(self, request_id: str) -> StreamDelta | None:
        state = self.requests.get(request_id)
        if state is None:
            return None
        self.scheduler.finish(state.seq, "abort")
        return self.outputs.delta(state, [])

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step ------------------------------------------------------
    def step(self) -> list[StreamDelta]:
        start = self.recorder.begin_step()
        batch = self.scheduler.schedule()
        self.recorder.phases.lap("schedule", start)
        result = self.executor.execute(batch)
        clock = time.monotonic()
        updates = self.scheduler.update(batch, result)
        deltas, finished = self.outputs.process(updates)
        self.recorder.phases.lap("postprocess", clock)
        self.recorder.record_step(batch, result, start, finished, deltas)
        self._publish_kv_events()
        return deltas

    # ---- statistics ----------------------------------------------------
    def stats(self) -> EngineStats:
        snapshot = self.recorder.snapshot()
        if self.runner.lora is None:
            return snapshot
        running, waiting = self.lora_requests()
        return dataclasses.replace(snapshot, max_loras=self.runner.lora.max_loras,
                                   running_lora_adapters=tuple(running), waiting_lora_adapters=tuple(waiting))

    def enable_step_profile(self, every: int, report: Callable[[str], None],
                            extra: dict[str, Callable[[], float]] | None = None) -> StepProfiler:
        """Report a table of where the time of every `every` steps went (--profile-steps)."""
        profiler = StepProfiler(self.runner, every, report, extra)
        self.step_listeners.append(profiler.on_step)
        return profiler

    def check_invariants(self) -> None:
        self.scheduler.check_invariants()

    @property
    def kv_tokens_per_gib(self) -> int:
        per_block = bytes_per_block(self.model_config, self.block_size, self.runner.kv_dtype)
        return 2**30 // per_block * self.block_size

    def describe(self) -> EngineInfo:
        return EngineInfo(
            model=self.model_name, num_blocks=self.num_blocks, block_size=self.block_size,
            max_model_len=self.max_model_len, batching=self.config.batching,
            device=str(self.runner.device), dtype=str(self.runner.dtype).removeprefix("torch."),
            attention=self.runner.backend.name, kv_cache_dtype=dtype_name(self.runner.kv_dtype),
            kv_tokens_per_gib=self.kv_tokens_per_gib, cpu=self.cpu.model, cpu_isa=self.cpu.target,
            cpu_flags=" ".join(self.cpu.flags), kernels=self.tuning.kernels)

