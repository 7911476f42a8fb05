"""The engine behind the server for a pooling model: requests queue, one worker thread takes
every waiting request at once and packs all their inputs into batches under the token budget
(engine/pooling/batching.py), so many small requests share forwards as prefills share a step.

No KV cache is kept between forwards, so there is nothing to preempt or to cache by prefix;
each forward is reported to the step listeners as a step of prompt tokens, and the server's
metrics and live view count it as such. It offers what server/runtime/engine_client.py asks
of an engine; generate() refuses, since the checkpoint has no generation head to serve.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from engine import native
from engine.config import EngineConfig
from engine.lora.adapter import LoraError
from engine.pooling.batching import plan_batches
from engine.pooling.inputs import PoolingInput
from engine.pooling.pooling_model import PoolingModel
from engine.request_limits import RequestLimits
from engine.runner.heap import keep_freed_memory
from engine.sampling_params import SamplingParams
from engine.structured_output import StructuredOutputSpec
from engine.tuning.tuning import kernel_choices
from engine.types.errors import EngineDeadError, InvalidRequestError
from engine.types.info import EngineInfo
from engine.types.outputs import StreamDelta
from engine.types.stats import EngineStats, StepStats

log = logging.getLogger("pagode")

TASK_NAMES = {"embed": "an embedding", "score": "a scoring"}


@dataclass
class _Job:
    kind: str  # embed or score
    inputs: list[PoolingInput]
    future: asyncio.Future[list[torch.Tensor]]
    loop: asyncio.AbstractEventLoop
    priority: int = 0
    arrival: float = field(default_factory=time.monotonic)


class AsyncPoolingEngine:
    num_blocks = 0  # no KV cache: every forward's scratch cache is freed with it
    block_size = 16

    def __init__(self, config: EngineConfig, task: str) -> None:
        self.config = config
        self.task = task
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagode-pool")
        self.model: PoolingModel = self._executor.submit(PoolingModel, config, task).result()
        keep_freed_memory()  # pooling runs on the CPU; the weights are in place
        self.tokenizer = self.model.tokenizer
        self.spec = self.model.spec
        self.model_name = self.model.source.name
        self.max_model_len = self.model.max_model_len
        self.hidden_size = self.model.hidden_size
        self.limits = RequestLimits(self.model.vocab_size, self.max_model_len, self.max_model_len, config.request_caps)
        self.dead_error: BaseException | None = None
        self._cpu = native.cpu_target()
        self._inbox: list[_Job] = []
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._stopping = False
        self._worker: Future[None] | None = None
        self._listeners: list[Callable[[StepStats], None]] = []
        self._stats = EngineStats()

    # ---- lifecycle ----

    async def start(self) -> None:
        self._stopping = False
        self._worker = self._executor.submit(self._run)

    async def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        await asyncio.to_thread(self._executor.shutdown, True)
        with self._lock:
            jobs, self._inbox = self._inbox, []
        for job in jobs:  # arrived after the worker's last turn: their callers must not wait forever
            _fail(job.future, EngineDeadError("the pooling engine was stopped"))

    @property
    def is_running(self) -> bool:
        return (not self._stopping and self.dead_error is None and self._worker is not None
                and not self._worker.done())

    # ---- pooling ----

    async def embed(self, inputs: list[PoolingInput], priority: int = 0) -> list[torch.Tensor]:
        """One vector per input (pooled, and normalized where the model says so)."""
        return await self._submit("embed", inputs, priority)

    async def score(self, inputs: list[PoolingInput], priority: int = 0) -> list[torch.Tensor]:
        """One relevance score per (query, document) input."""
        return await self._submit("score", inputs, priority)

    async def _submit(self, kind: str, inputs: list[PoolingInput], priority: int) -> list[torch.Tensor]:
        if not self.is_running:
            raise EngineDeadError(f"the pooling engine is not running: {self.dead_error!r}")
        loop = asyncio.get_running_loop()
        job = _Job(kind, inputs, loop.create_future(), loop, priority)
        with self._lock:
            self._inbox.append(job)
            self._stats.num_waiting += 1
        self._wakeup.set()
        return await job.future

    # ---- the worker ----

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._wakeup.wait()
                self._wakeup.clear()
                with self._lock:
                    jobs, self._inbox = self._inbox, []
                    self._stats.num_waiting = 0
                # A request whose caller went away (a closed connection cancels its future) is not computed.
                jobs = [job for job in jobs if not job.future.cancelled()]
                self._stats.num_running = len(jobs)
                for group in priority_groups(jobs):
                    for kind in ("embed", "score"):
                        self._run_jobs([j for j in group if j.kind == kind], kind)
                self._stats.num_running = 0
        except BaseException as err:
            log.exception("the pooling loop died")
            self.dead_error = err
            raise

    def _run_jobs(self, jobs: list[_Job], kind: str) -> None:
        """Every input of every job in batches of the token budget; each job gets its own
        vectors, or the error of a batch that held one of its inputs: a forward that fails
        fails only the requests in it, and the others' batches still run."""
        if not jobs:
            return
        inputs = [(job, i) for job in jobs for i in range(len(job.inputs))]
        flat = [job.inputs[i] for job, i in inputs]
        results: dict[int, list[torch.Tensor | None]] = {id(job): [None] * len(job.inputs) for job in jobs}
        errors: dict[int, BaseException] = {}
        run = self.model.embed if kind == "embed" else self.model.score
        for batch in plan_batches([len(x) for x in flat], self.config.token_budget):
            if all(id(inputs[i][0]) in errors for i in batch):
                continue
            start = time.perf_counter()
            try:
                outputs = run([flat[i] for i in batch])
            except Exception as err:  # noqa: BLE001 - the requests get the error, the loop goes on
                log.exception("a pooling forward failed")
                errors.update({id(inputs[i][0]): err for i in batch})
                continue
            for index, output in zip(batch, outputs, strict=True):
                job, row = inputs[index]
                results[id(job)][row] = output
            self._report(sum(len(flat[i]) for i in batch), len(batch), time.perf_counter() - start)
        for job in jobs:
            if id(job) in errors:
                job.loop.call_soon_threadsafe(_fail, job.future, errors[id(job)])
            else:
                outcome = [o for o in results[id(job)] if o is not None]
                job.loop.call_soon_threadsafe(_resolve, job.future, outcome)

    def _report(self, tokens: int, rows: int, seconds: float) -> None:
        s = self._stats
        s.num_steps_total += 1
        s.prompt_tokens_total += tokens
        s.max_concurrent_seqs = max(s.max_concurrent_seqs, rows)
        step = StepStats(num_tokens=tokens, num_prompt_tokens=tokens, num_generation_tokens=0, num_preemptions=0,
                         num_running=rows, num_waiting=s.num_waiting, kv_cache_usage=0.0, step_time=seconds,
                         num_prefill_tokens=tokens, forward_time=seconds)
        for listener in self._listeners:
            listener(step)

    # ---- what the server's engine protocol asks ----

    def generate(self, prompt: str | list[int], params: SamplingParams,
                 request_id: str, lora_name: str | None = None) -> AsyncGenerator[StreamDelta, None]:
        raise InvalidRequestError(
            f"this server runs {self.model_name} as {TASK_NAMES[self.task]} model (--task {self.task}): it serves "
            f"/v1/embeddings, /v1/score and /v1/rerank, not text generation", "model")

    def abort(self, request_id: str) -> None:
        return None

    def lora_adapters(self) -> dict[str, str]:
        return {}  # a pooling model takes no adapters

    async def load_lora_adapter(self, name: str, path: str) -> None:
        raise LoraError(f"this server runs {self.model_name} as {TASK_NAMES[self.task]} model: "
                        "LoRA adapters apply to text generation only")

    async def unload_lora_adapter(self, name: str) -> None:
        raise LoraError(f"{name} is not loaded: a pooling model takes no adapters")

    def stats(self) -> EngineStats:
        return self._stats

    async def reset_prefix_cache(self) -> None:
        return None  # no prefix cache: encoders recompute every input whole

    def cached_block_hashes(self) -> list[int]:
        return []  # no prefix cache

    def add_step_listener(self, callback: Callable[[StepStats], None]) -> None:
        self._listeners.append(callback)

    def enable_step_profile(self, every: int, report: Callable[[str], None],
                            extra: dict[str, Callable[[], float]] | None = None) -> None:
        return None

    def describe(self) -> EngineInfo:
        return EngineInfo(model=self.model_name, num_blocks=0, block_size=self.block_size,
                          max_model_len=self.max_model_len, batching=self.task, device="cpu",
                          dtype=self.model.precision, attention="sdpa", kv_cache_dtype="none", kv_tokens_per_gib=0,
                          cpu=self._cpu.model,
                          cpu_isa=self._cpu.target, cpu_flags=" ".join(self._cpu.flags),
                          kernels=kernel_choices())

    def compile_grammar(self, spec: StructuredOutputSpec) -> None:
        raise InvalidRequestError("a pooling model takes no structured outputs", "structured_outputs")


def priority_groups(jobs: list[_Job]) -> list[list[_Job]]:
    """The waiting jobs by priority, lower first (vLLM's order; all 0 under fcfs): a group's
    inputs share forwards, and a later group waits for the one before."""
    levels = sorted({job.priority for job in jobs})
    return [[job for job in jobs if job.priority == level] for level in levels]


def _resolve(future: asyncio.Future[list[torch.Tensor]], value: list[torch.Tensor]) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[list[torch.Tensor]], err: BaseException) -> None:
    if not future.done():
        future.set_exception(err)
