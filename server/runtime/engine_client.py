"""What the server may call on the engine: a small typed protocol.

engine.async_engine.AsyncEngine implements it; the server never reaches past it (no
LLMEngine, no scheduler, no runner), so the boundary stays `server -> engine` and a test
double or another engine only has to provide these members.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Protocol

from engine.config import EngineConfig
from engine.request_limits import RequestLimits
from engine.sampling_params import SamplingParams
from engine.structured_output import StructuredOutputSpec
from engine.tokenizer import Tokenizer
from engine.types.info import EngineInfo
from engine.types.outputs import StreamDelta
from engine.types.stats import EngineStats, StepStats


class EngineClient(Protocol):
    config: EngineConfig
    tokenizer: Tokenizer
    model_name: str
    max_model_len: int
    num_blocks: int
    block_size: int
    limits: RequestLimits
    dead_error: BaseException | None

    @property
    def is_running(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, prompt: str | list[int], params: SamplingParams,
                 request_id: str, lora_name: str | None = None) -> AsyncGenerator[StreamDelta, None]: ...

    async def load_lora_adapter(self, name: str, path: str) -> None: ...

    async def unload_lora_adapter(self, name: str) -> None: ...

    def lora_adapters(self) -> dict[str, str]: ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    async def reset_prefix_cache(self) -> None: ...

    def cached_block_hashes(self) -> list[int]:
        """The hashes (engine/prefix_hashes.py) of the blocks the prefix cache holds, for a
        router that sends a prompt where its prefix is cached; callable from any thread."""
        ...

    def add_step_listener(self, callback: Callable[[StepStats], None]) -> None: ...

    def enable_step_profile(self, every: int, report: Callable[[str], None],
                            extra: dict[str, Callable[[], float]] | None = None) -> None: ...

    def describe(self) -> EngineInfo: ...

    def compile_grammar(self, spec: StructuredOutputSpec) -> None: ...
