"""AsyncEngine's step loop on the real default model: steps run back to back in the worker
thread without waiting for the event loop, deltas still reach their stream in order, calls
meant for the engine's thread run between two steps, and a stopped engine refuses work."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import pytest

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.types.errors import EngineDeadError
from engine.types.stats import StepStats

pytestmark = pytest.mark.slow

PROMPT = [1, 504, 3458, 282, 2114, 1236, 30, 216]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[AsyncEngine]:
    engine = AsyncEngine(EngineConfig(kv_cache_memory="8MiB", max_model_len=128, quantization="auto"))
    await engine.start()
    yield engine
    await engine.stop()


async def test_steps_go_on_while_the_event_loop_is_busy(engine: AsyncEngine) -> None:
    """The worker hands each step's deltas to the loop and starts the next step at once: with
    the loop blocked, steps still complete, and every token arrives afterwards, in order."""
    steps: list[int] = []
    stepped = threading.Condition()

    def on_step(stats: StepStats) -> None:
        with stepped:
            steps.append(stats.num_decodes)
            stepped.notify_all()

    engine.add_step_listener(on_step)
    try:
        stream = engine.generate(PROMPT, GREEDY, "busy-loop")
        first = await stream.__anext__()
        with stepped:  # blocks the event loop thread: no await until three more steps ran
            target = len(steps) + 3
            assert stepped.wait_for(lambda: len(steps) >= target, timeout=120), \
                "no step ran while the event loop was busy"
        rest = [delta async for delta in stream]
    finally:
        engine.engine.step_listeners.remove(on_step)
    tokens = first.token_ids + [t for d in rest for t in d.token_ids]
    assert rest[-1].finished and rest[-1].finish_reason == "length"
    assert [d.num_output_tokens for d in [first, *rest]] == list(range(1, len(rest) + 2))
    assert len(tokens) == GREEDY.max_tokens
    # Greedy on the same engine: a stream whose loop was never blocked gives the same tokens.
    again = [t async for d in engine.generate(PROMPT, GREEDY, "busy-loop-again") for t in d.token_ids]
    assert again == tokens


async def test_a_call_for_the_engine_thread_runs_between_steps(engine: AsyncEngine) -> None:
    """reset_prefix_cache runs in the worker thread while a stream decodes, without ending it."""
    seen: list[int] = []
    real = engine.engine.reset_prefix_cache

    def reset() -> None:
        seen.append(threading.get_ident())
        real()

    engine.engine.reset_prefix_cache = reset  # type: ignore[method-assign]
    try:
        stream = engine.generate(PROMPT, GREEDY, "reset-while-decoding")
        first = await stream.__anext__()
        await asyncio.wait_for(engine.reset_prefix_cache(), timeout=120)
        rest = [delta async for delta in stream]
    finally:
        del engine.engine.reset_prefix_cache
    assert seen and seen[0] != threading.get_ident()
    assert len(first.token_ids) + sum(len(d.token_ids) for d in rest) == GREEDY.max_tokens


async def test_a_stopped_engine_refuses_requests() -> None:
    engine = AsyncEngine(EngineConfig(kv_cache_memory="8MiB", max_model_len=128, quantization="auto"))
    await engine.start()
    assert engine.is_running
    started = time.monotonic()
    await engine.stop()
    assert time.monotonic() - started < 60
    assert not engine.is_running
    with pytest.raises(EngineDeadError):
        await engine.generate(PROMPT, GREEDY, "after-stop").__anext__()
