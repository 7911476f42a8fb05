"""--kv-events-config in vLLM's JSON shape (vllm/config/kv_events.py), plus one key of pagode's.

    {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
     "replay_endpoint": "tcp://*:5558", "buffer_steps": 10000, "hwm": 100000,
     "max_queue_size": 100000, "topic": "", "event_layout": "array"}

publisher defaults to "zmq" when events are enabled, else "null" (nothing is published), as
in vLLM. event_layout is pagode's: "array" (the default) sends each event as a positional
msgpack array, which llm-d's decoder reads; "map" sends named fields, as newer vLLM does.
Unknown keys and bad values are refused, so that a typo never silently turns events off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.json_flag import read_json_object

PUBLISHERS = ("zmq", "null")
EVENT_LAYOUTS = ("array", "map")
ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")
KNOWN_KEYS = {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm",
              "max_queue_size", "topic", "event_layout"}


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    event_layout: str = "array"

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


def parse_kv_events_config(text: str | dict[str, Any] | None) -> KVEventsConfig | None:
    """The flag's JSON (or a decoded dict) as a config; None or empty: no events."""
    raw = read_json_object(text, "kv events config", KNOWN_KEYS)
    if raw is None:
        return None
    enabled = _typed(raw, "enable_kv_cache_events", bool, False)
    publisher = _choice(raw, "publisher", PUBLISHERS, "zmq" if enabled else "null")
    endpoint = _endpoint(raw, "endpoint", "tcp://*:5557")
    replay = _endpoint(raw, "replay_endpoint", None)
    sizes = {key: _count(raw, key, default, minimum)
             for key, default, minimum in (("buffer_steps", 10_000, 1), ("hwm", 100_000, 0),
                                           ("max_queue_size", 100_000, 1))}
    topic = _typed(raw, "topic", str, "")
    layout = _choice(raw, "event_layout", EVENT_LAYOUTS, "array")
    return KVEventsConfig(enabled, publisher, endpoint or "", replay, sizes["buffer_steps"], sizes["hwm"],
                          sizes["max_queue_size"], topic, layout)


def _typed(raw: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = raw.get(key, default)
    if not isinstance(value, kind):
        raise ValueError(f"kv events config: {key} must be a {kind.__name__}, not {value!r}")
    return value


def _choice(raw: dict[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = raw.get(key)
    if value is None:
        return default
    if value not in choices:
        raise ValueError(f"kv events config: {key} must be one of {list(choices)}, not {value!r}")
    return str(value)


def _endpoint(raw: dict[str, Any], key: str, default: str | None) -> str | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith(ENDPOINT_SCHEMES) or value.endswith("://"):
        raise ValueError(f"kv events config: {key} must be a ZMQ address such as tcp://*:5557 or "
                         f"ipc:///tmp/kv-events, not {value!r}")
    return value


def _count(raw: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"kv events config: {key} must be an integer >= {minimum}, not {value!r}")
    return value
