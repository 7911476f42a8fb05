"""The LoRA adapter the current request runs on, for the length of the request.

A context variable, set by ModelRouter (server/runtime/model_router.py) around the
request: the tasks that run its choices are created inside the request and see the same
value, and the generation service hands it to the engine as an argument. None: the base model.
"""

from __future__ import annotations

import contextvars

REQUESTED_ADAPTER: contextvars.ContextVar[str | None] = contextvars.ContextVar("requested_adapter", default=None)


def requested_adapter() -> str | None:
    return REQUESTED_ADAPTER.get()
