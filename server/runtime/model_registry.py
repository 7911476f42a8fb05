"""The models one server serves, as llama.cpp's router mode and Ollama serve several: each
named, loaded at start (the first) or when a request names it, and unloaded, least recently
used first, when loading another would pass `--max-loaded-models` or the memory budget.

A model with requests on it is never unloaded: a request pins its model from before its
body reaches the route until its response has been sent (server/runtime/model_router.py),
so a stream keeps its engine to the end. One load runs at a time; requests for models
already loaded go on meanwhile, and every engine steps in turn (engine/step_turns.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from engine.request_limits import clip
from server.api.errors import APIError
from server.runtime.engine_client import EngineClient
from server.runtime.served_model import ServedModel

logger = logging.getLogger("pagode.server")


class LoadRefused(APIError):
    """A model could not be loaded for a request (no room, or the load failed): answered
    before the request reaches its route."""


@dataclass(frozen=True)
class LoadLimits:
    max_loaded: int | None = None  # None: every model may be loaded at once
    memory_bytes: int | None = None  # None: no budget; else weights + KV cache of the loaded models


class ModelRegistry:
    def __init__(self, models: list[ServedModel], limits: LoadLimits, retry_after_s: int,
                 build: Callable[..., EngineClient], prepare: Callable[[EngineClient], None]) -> None:
        self.models = models
        self.limits = limits
        self.retry_after_s = retry_after_s
        self.build = build
        self.prepare = prepare
        self._loading = asyncio.Lock()

    @property
    def default(self) -> ServedModel:
        """The first model: what a request that names none gets, loaded at start."""
        return self.models[0]

    @property
    def several(self) -> bool:
        return len(self.models) > 1

    def find(self, name: str | None) -> ServedModel | None:
        if name is None:
            return self.default
        return next((m for m in self.models if m.answers_to(name)), None)

    def get(self, name: str | None) -> ServedModel:
        """The model, or OpenAI's 404 for a name the server does not serve."""
        model = self.find(name)
        if model is None:
            raise APIError(404, f"The model `{clip(name or '')}` does not exist.", "model")
        return model

    def loaded(self) -> list[ServedModel]:
        return [m for m in self.models if m.loaded]

    async def ensure_loaded(self, model: ServedModel) -> None:
        """Load `model` unless it is; make room first by unloading idle models, least
        recently used first. 503 when only busy models stand in the way."""
        if model.loaded:
            return
        async with self._loading:
            if model.loaded:
                return
            await self._make_room(model)
            try:
                await model.load(self.build, self.prepare)
            except Exception as exc:
                await model.unload()
                logger.error("loading the model %r failed: %s: %s", model.name, type(exc).__name__, exc)
                raise LoadRefused(500, f"The model `{model.name}` failed to load: {type(exc).__name__}: {exc}",
                               "model") from exc

    async def _make_room(self, model: ServedModel) -> None:
        while self._over_limits(model):
            idle = sorted((m for m in self.loaded() if not m.busy), key=lambda m: m.last_used)
            if not idle:
                raise LoadRefused(503, f"The model `{model.name}` cannot be loaded now: the loaded models "
                               f"({', '.join(m.name for m in self.loaded())}) all have requests running",
                               "model", headers={"Retry-After": str(self.retry_after_s)})
            logger.info("unloading %r (least recently used) to load %r", idle[0].name, model.name)
            await idle[0].unload()

    def _over_limits(self, model: ServedModel) -> bool:
        loaded = self.loaded()
        if self.limits.max_loaded is not None and len(loaded) + 1 > self.limits.max_loaded:
            return True
        if self.limits.memory_bytes is None or not loaded:
            return False
        return sum(m.memory_bytes() for m in loaded) + model.memory_bytes() > self.limits.memory_bytes

    async def unload(self, model: ServedModel) -> None:
        """Unload on request: 409 while requests run on it."""
        async with self._loading:
            if model.busy:
                raise APIError(409, f"The model `{model.name}` has requests running; unload it when they end",
                               "model")
            await model.unload()

    @contextlib.asynccontextmanager
    async def pinned(self, model: ServedModel) -> AsyncIterator[None]:
        """Hold `model` loaded for one request: loaded first if it is not."""
        model.pins += 1
        model.last_used = time.monotonic()
        try:
            await self.ensure_loaded(model)
            yield
        finally:
            model.pins -= 1
            model.last_used = time.monotonic()

    async def close(self) -> None:
        for model in self.models:
            await model.close()
