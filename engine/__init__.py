"""pagode's engine: a Llama-family model on a paged KV cache, batched at every iteration."""

import os

# libgomp (torch's and the CPU kernels') reads this once, when it loads, so it is set before
# anything here imports torch. An OpenMP worker spins this many times for the next parallel
# region before it sleeps on a futex. libgomp's default, 300,000, is shorter than the gap a
# server leaves between two decode steps while its event loop writes the SSE events: the
# workers would fall asleep at every step and pay a wake-up per region (docs/speed.md has
# the measurement). A user's value wins.
os.environ.setdefault("GOMP_SPINCOUNT", "10000000")

from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.types.outputs import CompletionOutput, RequestOutput, StreamDelta

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
