"""The engine a config gets: the LLM engine to generate, the pooling engine to embed or
score, as the checkpoint or `--task` says."""

from __future__ import annotations

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.pooling.async_pooling_engine import AsyncPoolingEngine
from engine.pooling.task import resolve_task


def build_engine(config: EngineConfig) -> AsyncEngine | AsyncPoolingEngine:
    task = resolve_task(config)
    return AsyncEngine(config) if task == "generate" else AsyncPoolingEngine(config, task)
