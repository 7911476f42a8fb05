"""--speculative-config in vLLM's JSON shape, validated with vLLM's rules (config/speculative.py).

`{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": m, "prompt_lookup_max": M}`:
K > 0; m and M default to 5, a single one given is copied to the other, and m > M is an
error; "[ngram]" is accepted as an alias of "ngram", as vLLM does. Unknown keys are refused
rather than ignored, so that a typo never silently turns speculation into something else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.json_flag import read_json_object

METHODS = ("ngram",)
METHOD_ALIASES = {"[ngram]": "ngram"}
KNOWN_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}
DEFAULT_LOOKUP = 5
MAX_LOOKUP = 32  # suffix lengths past this never change which occurrence is found in practice


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int


def parse_speculative_config(text: str | dict[str, Any] | None) -> SpeculativeConfig | None:
    """The flag's JSON (or an already decoded dict) as a config; None or empty: speculation off."""
    raw = read_json_object(text, "speculative config", KNOWN_KEYS)
    if raw is None:
        return None
    method = METHOD_ALIASES.get(raw.get("method", "ngram"), raw.get("method", "ngram"))
    if method not in METHODS:
        raise ValueError(f"speculative config: method must be one of {METHODS}, not {raw.get('method')!r}")
    k = _positive_int(raw, "num_speculative_tokens")
    low, high = _lookup_range(raw)
    return SpeculativeConfig(method, k, low, high)


def _positive_int(raw: dict[str, Any], key: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"speculative config: {key} must be an integer > 0, not {value!r}")
    return value


def _lookup_range(raw: dict[str, Any]) -> tuple[int, int]:
    """prompt_lookup_min/max with vLLM's defaults: one given is copied to the other."""
    low = raw.get("prompt_lookup_min")
    high = raw.get("prompt_lookup_max")
    if low is None and high is None:
        low = high = DEFAULT_LOOKUP
    elif low is None:
        low = high
    elif high is None:
        high = low
    checked = {"prompt_lookup_min": low, "prompt_lookup_max": high}
    for key in checked:
        value = _positive_int(checked, key)
        if value > MAX_LOOKUP:
            raise ValueError(f"speculative config: {key} must be <= {MAX_LOOKUP}, not {value}")
    assert isinstance(low, int) and isinstance(high, int)
    if low > high:
        raise ValueError(f"speculative config: prompt_lookup_min ({low}) > prompt_lookup_max ({high})")
    return low, high
