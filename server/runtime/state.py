"""What the app holds: the models it serves (server/runtime/model_registry.py; the first is
the default, and the only one unless several are given), the queue bound, response counts,
and the lifecycle flags that /health and the shutdown drain read. Its `admit` is the one
door of a generation request: every refusal that comes before tokenizing, in order."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from engine.config import EngineConfig
from engine.types.stats import EngineStats
from server.api.errors import APIError
from server.runtime.admission import Admission, default_queue_bound
from server.runtime.admitted import Admitted, P
from server.runtime.engine_client import EngineClient
from server.runtime.engine_factory import load_engine_factory
from server.runtime.generation import GenerationService
from server.runtime.metrics import ServerMetrics
from server.runtime.model_registry import LoadLimits, ModelRegistry
from server.runtime.response_stats import ResponseStats
from server.runtime.served_model import ModelSpec, ServedModel
from server.runtime.stats_sampler import StatsSampler
from server.settings import ServerSettings

logger = logging.getLogger("pagode.server")


class ServerState:
    def __init__(self, settings: ServerSettings, engine: EngineClient | None = None,
                 engine_config: EngineConfig | None = None,
                 prepare: Callable[[EngineClient], None] = lambda engine: None,
                 models: list[ModelSpec] | None = None, limits: LoadLimits | None = None) -> None:
        """`prepare` runs in the loading thread once an engine is built, before it serves
        (the app warms what serving will need of the engine). `models`, when given, are the
        several models served (the first is the default); else the one of `engine` or
        `engine_config`, named by --served-model-name."""
        self.settings = settings
        self.ready = False  # the default model was loaded and its loop started
        self.load_error: str | None = None
        self.draining = False
        self.admission = Admission(settings.max_num_queued_reqs, settings.retry_after_s,
                                   on_refuse=lambda: self.reject("queue_full"))
        self.on_fatal: Callable[[], None] | None = None  # the default model failed to load
        # HTTP responses, counted by server/middleware/response_metrics.py and the streams
        self.responses = ResponseStats()
        specs = models or [ModelSpec(settings.served_model_name, engine_config, engine)]
        served = [ServedModel(spec, settings, self.admission, self.responses if i == 0 else ResponseStats())
                  for i, spec in enumerate(specs)]
        self.registry = ModelRegistry(served, limits or LoadLimits(), settings.retry_after_s, self.build_engine,
                                      self.prepare_engine)
        self.prepare = prepare

    # ---- the default model's parts, as the single-model server has them ----

    @property
    def engine(self) -> EngineClient | None:
        return self.registry.default.engine

    @property
    def engine_config(self) -> EngineConfig | None:
        return self.registry.default.spec.config

    @property
    def metrics(self) -> ServerMetrics | None:
        return self.registry.default.metrics

    @property
    def generation(self) -> GenerationService | None:
        return self.registry.default.generation

    @property
    def sampler(self) -> StatsSampler | None:
        return self.registry.default.sampler

    # ---- lifecycle ----

    async def load_engine(self) -> None:
        """Load the default model (model loading runs in a thread, so /health answers 503 in
        the meantime); the others load when a request names them."""
        try:
            if self.engine is None:
                logger.info("loading the engine (/health answers 503 until it is ready)")
            await self.registry.default.load(self.build_engine, self.prepare_engine)
            self.ready = True
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

    def prepare_engine(self, engine: EngineClient) -> None:
        """The app's `prepare`, and the queue bound from the first engine's KV capacity."""
        self.prepare(engine)
        if self.settings.max_num_queued_reqs is None and not self.ready:
            self.admission.max_queued = default_queue_bound(engine.num_blocks * engine.block_size)

    async def close(self) -> None:
        await self.registry.close()

    def read_stats(self) -> EngineStats | None:
        return self.registry.default.read_stats()

    @property
    def in_flight(self) -> int:
        """Generation requests whose response is not complete yet, over every model."""
        return sum(m.generation.in_flight for m in self.registry.loaded() if m.generation is not None)

    async def wait_idle(self) -> None:
        for model in self.registry.loaded():
            if model.generation is not None:
                await model.generation.idle.wait()

    # ---- what requests ask ----

    @property
    def served_model_name(self) -> str:
        return self.registry.default.name

    def name_for(self, model: str | None) -> str:
        """The name a response carries: the adapter's when the request names a LoRA adapter
        (vLLM echoes it, and clients match responses to what they asked for), else the served
        name of the model it names (the default when it names none)."""
        found = self.registry.find(model)
        if found is None:
            return self.served_model_name
        return model if model is not None and found.runs_adapter(model) else found.name

    def health_problem(self) -> str | None:
        """None when healthy, else why not."""
        if self.load_error:
            return f"The engine failed to start: {self.load_error}"
        if not self.ready:
            return "The model is loading"
        if any(not m.engine.is_running for m in self.registry.loaded() if m.engine is not None):
            # Why it died (engine.dead_error) is the engine's exception text: it went to the
            # log when the loop died, and is kept from clients like any internal fault's.
            return "The engine loop is not running; the server log has the details"
        if self.draining:
            return "The server is shutting down"
        return None

    def require_engine(self) -> EngineClient:
        """The default model's engine, or a 503 saying why generation cannot happen now."""
        return self.engine_for(None)

    def serving(self, model: ServedModel) -> ServedModel:
        """`model` if it can serve now, else a 503 saying why not."""
        self.require_healthy()
        if not model.loaded:
            self.refuse(f"The model `{model.name}` is not loaded")
        return model

    def require_healthy(self) -> None:
        """A 503 saying why the server cannot serve now, if it cannot."""
        problem = self.health_problem()
        if problem is not None:
            self.refuse(problem)

    def refuse(self, problem: str) -> None:
        self.reject("draining" if self.draining else "not_ready")
        raise APIError(503, problem, headers={"Retry-After": str(self.settings.retry_after_s)})

    def engine_for(self, model: str | None) -> EngineClient:
        """The engine of `model` (the default when None): 404 for a name not served, 503
        when it cannot serve now."""
        served = self.serving(self.registry.get(model))
        assert served.engine is not None
        return served.engine

    def admit(self, model: str | None, check: Callable[[EngineClient], P]) -> Admitted[P]:
        """Let a generation request in, refusing it in the order clients expect: 503 (no
        engine), 404 (model), the request's own 400s (`check`, against the engine's limits),
        then 429 when the queue is full already. All before tokenizing: under a flood a
        refusal costs a parse, not a trip through the worker pool."""
        served = self.serving(self.registry.get(model))
        assert served.engine is not None and served.generation is not None
        plan = check(served.engine)
        self.admission.refuse_if_full(plan.num_seqs)
        return Admitted(served.engine, plan, self.admission, served.generation)

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
