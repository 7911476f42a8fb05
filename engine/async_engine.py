"""The engine behind the server: a worker thread that runs steps back to back.

The model runs in one worker thread, so the event loop stays responsive while a
step computes. Requests and aborts reach the engine through a queue that the
worker drains at the start of each step, so engine state is touched by one
thread only.

The worker does not wait for the event loop between steps: it hands each step's
deltas to the loop (call_soon_threadsafe) and starts the next step at once, so the
SSE encoding and socket writes of one step overlap the next step's compute. Were it
to wait, every token would pay two thread wake-ups and the loop's whole turn on top
of the step, while the OpenMP workers spin idle (docs/speed.md has the measurement).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.step_turns import STEPS
from engine.structured_output import StructuredOutputSpec
from engine.types.errors import EngineDeadError, InvalidRequestError
from engine.types.info import EngineInfo
from engine.types.outputs import StreamDelta
from engine.types.stats import EngineStats, StepStats

log = logging.getLogger("pagode")

MAX_CONSECUTIVE_FAILED_STEPS = 3


@dataclass
class _Pending:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    arrival: float
    lora_name: str | None = None


@dataclass
class _Refused:
    """add_request raised: the caller's generate() raises the same exception."""

    request_id: str
    error: BaseException


class AsyncEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # Every parallel region of the engine runs in this one thread: loading, the kernels'
        # load-time races and every step (why: ModelRunner._check_thread).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagode-step")
        self.engine = self._executor.submit(LLMEngine, config).result()
        self.tokenizer = self.engine.tokenizer
        self.model_name = self.engine.model_name
        self.max_model_len = self.engine.max_model_len
        self.num_blocks = self.engine.num_blocks
        self.block_size = self.engine.block_size
        self.limits = self.engine.limits
        self.dead_error: BaseException | None = None
        self._queues: dict[str, asyncio.Queue[StreamDelta | BaseException]] = {}
        self._inbox: list[_Pending] = []
        self._aborts: list[str] = []
        self._lock = threading.Lock()
        self._wakeup = threading.Event()  # set when the worker may have work
        self._stopping = False
        self._calls: list[tuple[Callable[[], object], Future[object]]] = []  # run between two steps
        self._task: asyncio.Task[None] | None = None
        self._stats = self.engine.stats()
        self._num_pending = 0

    # ---- lifecycle -----------------------------------------------------
    async def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._loop(), name="pagode-engine-loop")

    async def stop(self) -> None:
        self._stop_worker()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, EngineDeadError):
                await self._task
        self._executor.submit(self.engine.close)
        self._executor.shutdown(wait=True)

    @property
    def is_running(self) -> bool:
        return (self._task is not None and not self._task.done() and self.dead_error is None
                and not self._stopping)

    def describe(self) -> EngineInfo:
        return self.engine.describe()

    def compile_grammar(self, spec: StructuredOutputSpec) -> None:
        """Compile (or find in the cache) a structured-output grammar; raises
        StructuredOutputError. Thread-safe: the server calls it from a worker thread."""
        self.engine.structured.compile(spec)

    def enable_step_profile(self, every: int, report: Callable[[str], None],
                            extra: dict[str, Callable[[], float]] | None = None) -> None:
        self.engine.enable_step_profile(every, report, extra)

    async def reset_prefix_cache(self) -> None:
        """Forget every cached prefix block, between two steps (in the engine's own thread)."""
        await self._between_steps(self.engine.reset_prefix_cache)

    def cached_block_hashes(self) -> list[int]:
        """Read from the caller's thread while the engine steps: the block manager copies its
        table in one C call."""
        return self.engine.block_manager.cached_hashes()

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Read and attach a PEFT adapter between two steps: no step runs on half of it."""
        await self._between_steps(lambda: self.engine.load_lora_adapter(name, path))

    async def unload_lora_adapter(self, name: str) -> None:
        await self._between_steps(lambda: self.engine.unload_lora_adapter(name))

    def lora_adapters(self) -> dict[str, str]:
        """The loaded adapters (name -> folder); a copy, safe from any thread."""
        return dict(self.engine.lora_adapters())

    async def _between_steps(self, fn: Callable[[], object]) -> object:
        """fn() in the worker thread, between two steps: the step loop holds that thread
        while it runs, so the call waits in a list that the loop drains before each step."""
        done: Future[object] = Future()
        with self._lock:  # the worker sets _stopping under this lock as it drains the list
            queued = self.is_running
            if queued:
                self._calls.append((fn, done))
        if not queued:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        self._wakeup.set()
        return await asyncio.wrap_future(done)

    def add_step_listener(self, callback: Callable[[StepStats], None]) -> None:
        self.engine.step_listeners.append(callback)

    def stats(self) -> EngineStats:
        # Accepted requests the scheduler has not seen yet are waiting too.
        return dataclasses.replace(self._stats, num_waiting=self._stats.num_waiting + self._num_pending)

    # ---- requests ------------------------------------------------------
    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str, lora_name: str | None = None) -> AsyncGenerator[StreamDelta, None]:
        if not self.is_running:
            raise EngineDeadError(f"the engine loop is not running: {self.dead_error!r}")
        if params.n != 1:
            raise InvalidRequestError("AsyncEngine.generate serves n=1; fan out choices", "n")
        if request_id in self._queues:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        # Tokenizing and validation run in the worker thread, in add_request: engine state
        # is touched by that thread only, and a long prompt never blocks the event loop.
        queue: asyncio.Queue[StreamDelta | BaseException] = asyncio.Queue()
        self._queues[request_id] = queue
        with self._lock:
            self._inbox.append(_Pending(request_id, prompt, params, time.monotonic(), lora_name))
            self._num_pending += 1
        self._wakeup.set()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self.abort(request_id)  # the caller went away (disconnect, cancel)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)
        self._wakeup.set()

    # ---- the loop ------------------------------------------------------
    async def _loop(self) -> None:
        """Run the worker's step loop until it stops or dies; fail every stream if it dies."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wrap_future(self._executor.submit(self._run_steps, loop))
        except asyncio.CancelledError:
            self._stop_worker()
            self._fail_all(EngineDeadError("the engine was stopped"))
            raise
        except BaseException as err:
            log.exception("the engine loop died")
            self.dead_error = err
            self._fail_all(EngineDeadError(f"the engine loop died: {err}"))

    def _stop_worker(self) -> None:
        self._stopping = True
        self._wakeup.set()

    def _run_steps(self, loop: asyncio.AbstractEventLoop) -> None:
        """Runs in the worker thread: steps back to back while there is work, each step's
        deltas handed to the event loop without waiting for it; sleeps when idle."""
        failures = 0
        try:
            while not self._stopping:
                self._run_calls()
                if not self._has_work():
                    self._wakeup.clear()
                    if not self._has_work() and not self._calls and not self._stopping:
                        self._wakeup.wait()
                    continue
                deltas, step_failed = self._step()
                failures = failures + 1 if step_failed else 0
                if failures >= MAX_CONSECUTIVE_FAILED_STEPS:
                    raise RuntimeError(f"{failures} consecutive steps failed")
                if deltas:
                    loop.call_soon_threadsafe(self._dispatch, deltas)
        finally:
            self._fail_calls()

    def _run_calls(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, []
        for fn, done in calls:
            try:
                done.set_result(fn())
            except Exception as err:  # noqa: BLE001 - the caller gets the error itself
                done.set_exception(err)

    def _fail_calls(self) -> None:
        with self._lock:
            self._stopping = True  # calls arriving from now on run in the executor (is_running)
            calls, self._calls = self._calls, []
        for _, done in calls:
            done.set_exception(EngineDeadError("the engine loop stopped before the call ran"))

    def _has_work(self) -> bool:
        return bool(self._inbox or self._aborts or self.engine.has_unfinished())

    def _step(self) -> tuple[list[StreamDelta | _Refused], bool]:
        """Runs in the worker thread: apply aborts and arrivals, then one engine step."""
        with self._lock:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
            self._num_pending = 0
        deltas: list[StreamDelta | _Refused] = []
        for p in inbox:
            try:
                self.engine.add_request(p.request_id, p.prompt, p.params, p.arrival, p.lora_name)
            except Exception as err:  # noqa: BLE001 - the caller gets the error itself
                deltas.append(_Refused(p.request_id, err))
        for request_id in aborts:
            delta = self.engine.abort_request(request_id)
            if delta is not None:
                deltas.append(delta)
        step_failed = False
        try:
            with STEPS.turn():  # one step at a time across the process's engines
                step_deltas = self.engine.step()
            # A request at fault (error_param set) is no sign of a broken engine.
            step_failed = bool(step_deltas) and all(d.error and d.error_param is None for d in step_deltas)
            deltas.extend(step_deltas)
        finally:
            self._stats = self.engine.stats()
        return deltas, step_failed

    def _dispatch(self, deltas: list[StreamDelta | _Refused]) -> None:
        for d in deltas:
            queue = self._queues.get(d.request_id)
            if queue is not None:
                queue.put_nowait(d.error if isinstance(d, _Refused) else d)

    def _fail_all(self, err: BaseException) -> None:
        for queue in self._queues.values():
            queue.put_nowait(err)
