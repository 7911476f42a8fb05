"""The JSON-object flags pagode takes in vLLM's shape (--speculative-config,
--kv-events-config): decoded and checked for unknown keys in one place, so that every such
flag refuses a typo the same way, naming the keys it knows."""

from __future__ import annotations

import json
from typing import Any


def read_json_object(text: str | dict[str, Any] | None, what: str, known: set[str]) -> dict[str, Any] | None:
    """The flag's JSON (or an already decoded dict) as a dict; None when absent or empty."""
    if text is None or text == "" or text == {}:
        return None
    raw = json.loads(text) if isinstance(text, str) else dict(text)
    if not isinstance(raw, dict):
        raise ValueError(f"{what} must be a JSON object")
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{what}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    return raw
