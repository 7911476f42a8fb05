"""What the app holds: the engine (once loaded), the queue bound, metrics, and the
lifecycle flags that /health and the shutdown drain read."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable

from fastapi import Request

from engine.config import EngineConfig
from engine.io.stats import EngineStats
from server.api.errors import APIError, error_type
from server.runtime.admission import Admission, QueueSlot, default_queue_bound
from server.runtime.engine_client import EngineClient
from server.runtime.generation import ChoiceStream, GenerationService, SubRequest
from server.runtime.metrics import ServerMetrics
from server.settings import ServerSettings
from server.translate.user_text import PlainTextEncoder

logger = logging.getLogger("pagode.server")

EngineFactory = Callable[[EngineConfig], EngineClient]


def default_engine_factory() -> EngineFactory:
    """AsyncEngine, imported when first needed: importing it loads torch."""
    from engine.async_engine import AsyncEngine

    return AsyncEngine


class ServerState:
    def __init__(self, settings: ServerSettings, engine: EngineClient | None = None,
                 engine_config: EngineConfig | None = None,
                 engine_factory: EngineFactory | None = None) -> None:
        if engine is None and engine_config is None:
            raise ValueError("give an engine or an engine config")
        self.settings = settings
        self.engine: EngineClient | None = engine
        self.engine_config = engine_config
        self.engine_factory = engine_factory
        self.ready = False  # the engine is loaded and its loop started
        self.load_error: str | None = None
        self.draining = False
        self.in_flight = 0  # generation requests whose response is not complete yet
        self.idle = asyncio.Event()
        self.idle.set()
        self.admission = Admission(settings.max_num_queued_reqs, settings.retry_after_s)
        self.metrics: ServerMetrics | None = None
        self.generation: GenerationService | None = None
        self.on_fatal: Callable[[], None] | None = None  # the engine failed to load
        self._text_encoder: PlainTextEncoder | None = None
        # HTTP responses by (status, error type), counted by server/middleware/response_metrics.py
        self.responses: Counter[tuple[str, str]] = Counter()
        self.encode_seconds = 0.0  # spent building and JSON-encoding stream chunks (profiling)

    # ---- lifecycle ----

    async def load_engine(self) -> None:
        """Build the engine (model loading runs in a thread, so /health answers 503 in the
        meantime), start its loop, and wire metrics."""
        try:
            engine = self.engine
            if engine is None:
                logger.info("loading the engine (/health answers 503 until it is ready)")
                assert self.engine_config is not None
                factory = self.engine_factory or default_engine_factory()
                built: EngineClient = await asyncio.to_thread(factory, self.engine_config)
                self.engine = engine = built
            if not engine.is_running:
                await engine.start()
            self.wire_engine(engine)
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            logger.exception("the engine failed to start")
            if self.on_fatal is not None:
                self.on_fatal()

    def wire_engine(self, engine: EngineClient) -> None:
        config = self.engine_config or engine.config
        max_batched = config.token_budget
        self._text_encoder = PlainTextEncoder(engine.tokenizer)
        if self.settings.max_num_queued_reqs is None:
            self.admission.max_queued = default_queue_bound(engine.num_blocks * engine.block_size)
        self.metrics = ServerMetrics(self.served_model_name, engine.max_model_len, max_batched,
                                     read_stats=self.read_stats,
                                     read_queued=lambda: self.admission.queued,
                                     read_responses=lambda: self.responses,
                                     cache_info=engine.describe())
        engine.add_step_listener(self.metrics.observe_step)
        if self.settings.profile_steps > 0:
            engine.enable_step_profile(self.settings.profile_steps, logger.info,
                                       {"SSE/JSON encoding": lambda: self.encode_seconds})
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
        if self.generation is not None:
            self.generation.abort_all()
        if self.engine is not None and self.ready:
            await self.engine.stop()

    @property
    def text_encoder(self) -> PlainTextEncoder:
        """Encodes chat message content as plain text (set once the engine is loaded)."""
        assert self._text_encoder is not None, "the engine is not loaded"
        return self._text_encoder

    def read_stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

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
            dead = getattr(self.engine, "dead_error", None)
            return f"The engine loop is not running: {dead}" if dead else \
                "The engine loop is not running"
        if self.draining:
            return "The server is shutting down"
        return None

    def require_engine(self) -> EngineClient:
        """The engine, or a 503 saying why generation cannot happen now."""
        problem = self.health_problem()
        if problem is not None:
            if self.metrics is not None:
                self.metrics.reject("draining" if self.draining else "not_ready")
            raise APIError(503, problem, headers={"Retry-After": str(self.settings.retry_after_s)})
        assert self.engine is not None
        return self.engine

    def refuse_if_full(self, num_seqs: int) -> None:
        """A 429 before tokenizing, when the queue is already full: under a flood the
        refusal costs a parse, not a trip through the worker pool. start_generation takes
        the slots for real (no await between its check and its take)."""
        if self.admission.is_full(num_seqs):
            assert self.metrics is not None
            self.metrics.reject("queue_full")
            self.admission.admit(num_seqs)  # raises the 429 with Retry-After

    def start_generation(self, subs: list[SubRequest]) -> ChoiceStream:
        """Admit the sub-requests (429 when the queue is full) and start them."""
        assert self.generation is not None and self.metrics is not None
        try:
            slots: list[QueueSlot] = self.admission.admit(len(subs))
        except APIError:
            self.metrics.reject("queue_full")
            raise
        return self.generation.start(subs, slots)

    def count_response(self, status: int) -> None:
        self.responses[(str(status), error_type(status) if status >= 400 else "none")] += 1

    def begin_request(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def end_request(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()


def get_state(request: Request) -> ServerState:
    """The server's state, as the app holds it."""
    state: ServerState = request.app.state.server
    return state
