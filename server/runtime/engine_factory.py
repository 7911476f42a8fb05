"""How the server builds its engine: engine.async_engine.AsyncEngine (or, for an embedding or
scoring checkpoint, engine.pooling's AsyncPoolingEngine), or the callable that
`pagode serve --engine-factory MODULE:CALLABLE` names (a custom engine, or a test double
such as tests/dying_server.py). It is called with the EngineConfig, in the loading thread,
and must return what runtime/engine_client.py describes."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

from engine.config import EngineConfig
from server.runtime.engine_client import EngineClient

EngineFactory = Callable[[EngineConfig], EngineClient]


def load_engine_factory(spec: str | None) -> EngineFactory:
    """Import the factory when first needed: importing an engine loads torch."""
    if spec is None:
        from engine.pooling.engines import build_engine

        return cast(EngineFactory, build_engine)
    module_name, _, path = spec.partition(":")
    target: object = importlib.import_module(module_name)
    for name in path.split("."):
        target = getattr(target, name)
    if not callable(target):
        raise TypeError(f"--engine-factory {spec}: {type(target).__name__} is not callable")
    return cast(EngineFactory, target)
