"""A small worker pool for CPU-heavy request work (JSON parsing of big bodies, tokenizing,
chat templates), so that the event loop keeps answering /health and streaming tokens while
one request carries a large input."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pagode-request")


async def run_blocking(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))
