"""What the app holds: the engine (once loaded), the queue bound, metrics, response counts,
and the lifecycle flags that /health and the shutdown drain read. Its `admit` is the one
door of a generation request: every refusal that comes before tokenizing, in order."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from engine.config import EngineConfig
from engine.io.request_limits import clip
from engine.io.stats import EngineStats
from server.api.errors import APIError
from server.runtime.admission import Admission, default_queue_bound
from server.runtime.admitted import Admitted, P
from server.runtime.engine_client import EngineClient
from server.runtime.engine_factory import load_engine_factory
from server.runtime.generation import GenerationService
from server.runtime.metrics import ServerMetrics
from server.runtime.response_stats import ResponseStats
from server.runtime.stats_sampler import StatsSampler
from server.settings import ServerSettings

logger = logging.getLogger("pagode.server")


class ServerState:
    def __init__(self, settings: ServerSettings, engine: EngineClient | None = None,
                 engine_config: EngineConfig | None = None,
                 prepare: Callable[[EngineClient], None] = lambda engine: None) -> None:
        """`prepare` runs in the loading thread once the engine is built, before the server
        says it is ready (the app warms what serving will need of the engine)."""
        if engine is None and engine_config is None:
            raise ValueError("give an engine or an engine config")
        self.settings = settings
        self.engine: EngineClient | None = engine
        self.engine_config = engine_config
        self.prepare = prepare
        self.ready = False  # the engine is loaded and its loop started
        self.load_error: str | None = None
        self.draining = False
        self.admission = Admission(settings.max_num_queued_reqs, settings.retry_after_s,
                                   on_refuse=lambda: self.reject("queue_full"))
        self.metrics: ServerMetrics | None = None
        self.generation: GenerationService | None = None
        self.sampler: StatsSampler | None = None  # the live view's history, once loaded
        self.on_fatal: Callable[[], None] | None = None  # the engine failed to load
        # HTTP responses, counted by server/middleware/response_metrics.py and the streams
        self.responses = ResponseStats()

    # ---- lifecycle ----

    async def load_engine(self) -> None:
        """Build the engine (model loading runs in a thread, so /health answers 503 in the
        meantime), start its loop, and wire metrics."""
        try:
            engine = self.engine
            if engine is None:
                logger.info("loading the engine (/health answers 503 until it is ready)")
                assert self.engine_config is not None
                self.engine = engine = await asyncio.to_thread(self.build_engine, self.engine_config)
            await asyncio.to_thread(self.prepare, engine)
            if not engine.is_running:
                await engine.start()
            self.wire_engine(engine)
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, ValueError):  # a refusal that says what is wrong: no traceback
                logger.error("the engine failed to start: %s", exc)
            else:
                logger.exception("the engine failed to start")
            if self.on_fatal is not None:
                self.on_fatal()

    def build_engine(self, config: EngineConfig) -> EngineClient:
        return load_engine_factory(self.settings.engine_factory)(config)

    def wire_engine(self, engine: EngineClient) -> None:
        config = self.engine_config or engine.config
        if self.settings.max_num_queued_reqs is None:
            self.admission.max_queued = default_queue_bound(engine.num_blocks * engine.block_size)
        self.metrics = ServerMetrics(self.served_model_name, engine.max_model_len,
                                     config.token_budget, read_stats=self.read_stats,
                                     read_queued=lambda: self.admission.queued,
                                     responses=self.responses,
                                     cache_info=engine.describe(), compat=self.settings.metrics_compat)
        engine.add_step_listener(self.metrics.observe_step)
        self.sampler = StatsSampler(self.read_stats, lambda: self.admission.queued)
        self.metrics.watchers.append(self.sampler.recorder)
        engine.add_step_listener(self.sampler.recorder.observe_step)
        self.sampler.start()
        if self.settings.profile_steps > 0:
            engine.enable_step_profile(self.settings.profile_steps, logger.info,
                                       {"SSE/JSON encoding": lambda: self.responses.encode_seconds})
        self.generation = GenerationService(engine, self.metrics,
                                            self.settings.log_requests_text)
        self.ready = True
        blocks = engine.num_blocks
        logger.info(
            "Serving %s as %r at %s: %d KV blocks of %d tokens (%d tokens), max_model_len %d, "
            "batching %s, queue bound %s, KV cache %s", engine.model_name, self.served_model_name,
            self.settings.url or "?", blocks, engine.block_size, blocks * engine.block_size,
            engine.max_model_len, config.batching, self.admission.max_queued,
            engine.describe().kv_cache_dtype)

    async def close(self) -> None:
        if self.sampler is not None:
            await self.sampler.stop()
        if self.generation is not None:
            self.generation.abort_all()
        if self.engine is not None and self.ready:
            await self.engine.stop()

    def read_stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

    @property
    def in_flight(self) -> int:
        """Generation requests whose response is not complete yet."""
        return self.generation.in_flight if self.generation is not None else 0

    async def wait_idle(self) -> None:
        if self.generation is not None:
            await self.generation.idle.wait()

    # ---- what requests ask ----

    @property
    def served_model_name(self) -> str:
        if self.settings.served_model_name:
            return self.settings.served_model_name
        if self.engine is not None:
            return str(self.engine.model_name)
        model = self.engine_config.model if self.engine_config else None
        return str(model or "default")

    def health_problem(self) -> str | None:
        """None when healthy, else why not."""
        if self.load_error:
            return f"The engine failed to start: {self.load_error}"
        if not self.ready or self.engine is None:
            return "The model is loading"
        if not self.engine.is_running:
            # Why it died (engine.dead_error) is the engine's exception text: it went to the
            # log when the loop died, and is kept from clients like any internal fault's.
            return "The engine loop is not running; the server log has the details"
        if self.draining:
            return "The server is shutting down"
        return None

    def require_engine(self) -> EngineClient:
        """The engine, or a 503 saying why generation cannot happen now."""
        problem = self.health_problem()
        if problem is not None:
            self.reject("draining" if self.draining else "not_ready")
            raise APIError(503, problem, headers={"Retry-After": str(self.settings.retry_after_s)})
        assert self.engine is not None
        return self.engine

    def engine_for(self, model: str | None) -> EngineClient:
        """The engine (503 without one) if it serves `model`: the served name or the
        engine's own; any other name is a 404."""
        engine = self.require_engine()
        if model is not None and model not in {self.served_model_name, str(engine.model_name)}:
            raise APIError(404, f"The model `{clip(model)}` does not exist.", "model")
        return engine

    def admit(self, model: str | None, check: Callable[[EngineClient], P]) -> Admitted[P]:
        """Let a generation request in, refusing it in the order clients expect: 503 (no
        engine), 404 (model), the request's own 400s (`check`, against the engine's limits),
        then 429 when the queue is full already. All before tokenizing: under a flood a
        refusal costs a parse, not a trip through the worker pool."""
        engine = self.engine_for(model)
        plan = check(engine)
        self.admission.refuse_if_full(plan.num_seqs)
        assert self.generation is not None
        return Admitted(engine, plan, self.admission, self.generation)

    def reject(self, reason: str) -> None:
        """Count a refused request (pagode:request_rejected_total)."""
        if self.metrics is not None:
            self.metrics.reject(reason)


def get_state(request: Request) -> ServerState:
    """The server's state, as the app holds it."""
    state: ServerState = request.app.state.server
    return state


# A route takes the state as a FastAPI dependency, so the request itself goes straight to
# parsing and the state is met once, at admission.
State = Annotated[ServerState, Depends(get_state)]
