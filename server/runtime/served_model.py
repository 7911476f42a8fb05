"""One model the server can serve: its engine while loaded, and what serving it needs around
the engine (metrics labelled with its name, the generation service, the live view's sampler).

The engine comes and goes (loaded at start or on demand, unloaded to make room); the metrics
and the live view's sampler stay, so a model's counters and history do not start again from
zero when it is loaded again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from engine.types.stats import EngineStats
from server.runtime.admission import Admission
from server.runtime.engine_client import EngineClient
from server.runtime.generation import GenerationService
from server.runtime.metrics import ServerMetrics
from server.runtime.response_stats import ResponseStats
from server.runtime.stats_sampler import StatsSampler
from server.settings import ServerSettings

logger = logging.getLogger("pagode.server")


@dataclass
class ModelSpec:
    """What to serve: a served name (None: the engine's own model name), and the engine's
    config, or an engine already built (tests, embedding the app)."""

    name: str | None
    config: EngineConfig | None = None
    engine: EngineClient | None = None


class ServedModel:
    def __init__(self, spec: ModelSpec, settings: ServerSettings, admission: Admission,
                 responses: ResponseStats) -> None:
        """`responses` are the server's HTTP counts, reported under this model's label (the
        server gives them to its default model only, so they are counted once)."""
        if spec.engine is None and spec.config is None:
            raise ValueError("give an engine or an engine config")
        self.spec = spec
        self.settings = settings
        self.admission = admission
        self.responses = responses
        self.engine: EngineClient | None = spec.engine
        self.metrics: ServerMetrics | None = None
        self.generation: GenerationService | None = None
        self.sampler: StatsSampler | None = None
        self.pins = 0  # requests that hold the model: it is never unloaded under them
        self.last_used = time.monotonic()

    @property
    def name(self) -> str:
        if self.spec.name:
            return self.spec.name
        if self.engine is not None:
            return str(self.engine.model_name)
        model = self.spec.config.model if self.spec.config else None
        return str(model or "default")

    @property
    def loaded(self) -> bool:
        return self.engine is not None and self.generation is not None

    @property
    def busy(self) -> bool:
        """Requests hold it or run on it: unloading it now would cut them."""
        return self.pins > 0 or (self.generation is not None and self.generation.in_flight > 0)

    def answers_to(self, name: str) -> bool:
        """The served name, the engine's own model name (clients of one model send either), or
        one of its LoRA adapters (the request then runs on that adapter)."""
        return name == self.name or (self.engine is not None and (
            name == str(self.engine.model_name) or name in self.engine.lora_adapters()))

    def runs_adapter(self, name: str) -> bool:
        """`name` is one of its LoRA adapters, not the model itself."""
        return name != self.name and self.engine is not None and name in self.engine.lora_adapters()

    def memory_bytes(self) -> int:
        """What loading it takes, for the memory budget: its weight files and its KV cache."""
        config = self.spec.config or (self.engine.config if self.engine is not None else None)
        if config is None:
            return 0
        path = Path(config.model).expanduser() if config.model else None
        weights = 0
        if path is not None and path.is_dir():
            weights = sum(p.stat().st_size for p in path.glob("*.safetensors"))
        elif path is not None and path.is_file():
            weights = sum(p.stat().st_size for p in path.parent.glob(_parts_glob(path)))
        return weights + config.kv_cache_bytes

    # ---- lifecycle ----

    async def load(self, build: Callable[[EngineConfig], EngineClient],
                   prepare: Callable[[EngineClient], None]) -> EngineClient:
        """Build the engine in a thread (the event loop keeps serving the other models), start
        its loop and wire what serving it needs."""
        engine = self.engine
        if engine is None:
            assert self.spec.config is not None
            logger.info("loading the model %r", self.name)
            engine = await asyncio.to_thread(build, self.spec.config)
        await asyncio.to_thread(prepare, engine)
        if not engine.is_running:
            await engine.start()
        self.engine = engine
        self.wire(engine)
        return engine

    def wire(self, engine: EngineClient) -> None:
        config = self.spec.config or engine.config
        if self.metrics is None:
            self.metrics = ServerMetrics(self.name, engine.max_model_len, config.token_budget,
                                         read_stats=self.read_stats, read_queued=lambda: self.admission.queued,
                                         responses=self.responses, cache_info=engine.describe(),
                                         compat=self.settings.metrics_compat)
        engine.add_step_listener(self.metrics.observe_step)
        if self.sampler is None:  # kept across unloads, as the metrics are: the live view's history
            self.sampler = StatsSampler(self.read_stats, lambda: self.admission.queued)
            self.metrics.watchers.append(self.sampler.recorder)
            self.sampler.start()
        engine.add_step_listener(self.sampler.recorder.observe_step)
        if self.settings.profile_steps > 0:
            engine.enable_step_profile(self.settings.profile_steps, logger.info,
                                       {"SSE/JSON encoding": lambda: self.responses.encode_seconds})
        self.generation = GenerationService(engine, self.metrics, self.settings.log_requests_text)
        blocks = engine.num_blocks
        logger.info(
            "Serving %s as %r at %s: %d KV blocks of %d tokens (%d tokens), max_model_len %d, "
            "batching %s, queue bound %s, KV cache %s", engine.model_name, self.name,
            self.settings.url or "?", blocks, engine.block_size, blocks * engine.block_size,
            engine.max_model_len, config.batching, self.admission.max_queued,
            engine.describe().kv_cache_dtype)

    async def unload(self) -> None:
        """Stop the engine and let its memory go; the metrics and the live view's history stay."""
        engine, self.engine = self.engine, None
        if self.generation is not None:
            self.generation.abort_all()
            self.generation = None
        if engine is not None:
            await engine.stop()
            logger.info("unloaded the model %r", self.name)

    async def close(self) -> None:
        """Unload, and stop sampling for the live view (the server is going away)."""
        await self.unload()
        if self.sampler is not None:
            await self.sampler.stop()

    def read_stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None


def _parts_glob(path: Path) -> str:
    """The file, or every part of a split GGUF whose first part it is."""
    stem, marker, _ = path.name.rpartition("-00001-of-")
    return f"{stem}-*-of-*.gguf" if marker else path.name
