"""pagode's engine: a Llama-family model on a paged KV cache, batched at every iteration."""

from engine.config import EngineConfig
from engine.outputs import CompletionOutput, RequestOutput, StreamDelta
from engine.sampling_params import SamplingParams

__all__ = ["LLM", "AsyncEngine", "CompletionOutput", "EngineConfig", "RequestOutput",
           "SamplingParams", "StreamDelta"]


def __getattr__(name: str) -> object:
    # Heavy imports (torch, transformers) load only when these are used.
    if name == "LLM":
        from engine.llm import LLM
        return LLM
    if name == "AsyncEngine":
        from engine.async_engine import AsyncEngine
        return AsyncEngine
    raise AttributeError(name)
