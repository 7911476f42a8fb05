"""GET /stats/stream: the live view's feed, as server-sent events. The first event is a
snapshot (both resolutions of the ring and the saturation signals), then one delta per
second with the new points and the signals judged again. Behind --api-key like the API:
the series say how busy the server is, and what its users send (docs/ui.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from sse_starlette import EventSourceResponse

from server.api.errors import error_response
from server.runtime.saturation import judge_all
from server.runtime.state import ServerState, State
from server.runtime.stats_ring import COARSE_INTERVAL_S, SERIES, StatsRing
from server.runtime.stats_sampler import StatsSampler

router = APIRouter()

DRAIN_CHECK_S = 5.0  # how often a quiet stream looks whether the server is shutting down


def snapshot(ring: StatsRing, model: str, interval_s: float) -> dict[str, Any]:
    return {"type": "snapshot", "model": model, "interval_s": interval_s,
            "coarse_interval_s": COARSE_INTERVAL_S, "series": list(SERIES),
            "fine": list(ring.fine), "coarse": list(ring.coarse),
            "signals": judge_all(ring.fine, ring.coarse)}


async def stats_events(state: ServerState, sampler: StatsSampler, model: str) -> AsyncIterator[dict[str, str]]:
    ring = sampler.ring
    fine_seq, coarse_seq = ring.fine_seq, ring.coarse_seq
    first = snapshot(ring, model, sampler.interval_s)
    yield {"event": "snapshot", "data": json.dumps(first)}
    while not state.draining:
        waiting = sampler.new_point
        try:
            await asyncio.wait_for(waiting.wait(), DRAIN_CHECK_S)
        except TimeoutError:
            continue
        fine, coarse = ring.since(fine_seq, coarse_seq)
        fine_seq, coarse_seq = ring.fine_seq, ring.coarse_seq
        delta = {"type": "delta", "fine": fine, "coarse": coarse,
                 "signals": judge_all(ring.fine, ring.coarse)}
        yield {"event": "delta", "data": json.dumps(delta)}


# Out of the OpenAPI schema: an endless event stream is no operation a client generator or a
# fuzzer can call and finish; docs/ui.md describes it.
@router.get("/stats/stream", include_in_schema=False)
async def stats_stream(state: State, model: str | None = None) -> Response:
    """The default model's feed, or `?model=NAME`'s on a server of several (404 for a name
    not served; 503 before the model was first loaded)."""
    served = state.registry.get(model)
    if served.sampler is None:
        return error_response(503, "The model is loading")
    return EventSourceResponse(stats_events(state, served.sampler, served.name), sep="\n",
                               send_timeout=state.settings.sse_send_timeout_s)
