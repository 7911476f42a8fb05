"""Qwen2/Qwen3's sliding window, as transformers' configs compute it: no window at all unless
`use_sliding_window`, and then only on the layers `layer_types` calls sliding, which, when
the config does not list them, are those from `max_window_layers` on.

Hub checkpoints set use_sliding_window false while still carrying a sliding_window and
max_window_layers, so reading either alone would put a window where transformers has none.
"""

from __future__ import annotations

from typing import Any

SLIDING = "sliding_attention"
MAX_WINDOW_LAYERS = 28  # transformers' Qwen2Config/Qwen3Config default


def window_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig's sliding_window and layer_types, or nothing when every layer attends fully."""
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", False) else None
    if window is None:
        return {}
    first = cfg.get("max_window_layers", MAX_WINDOW_LAYERS)
    types = cfg.get("layer_types") or [SLIDING if i >= first else "full_attention"
                                       for i in range(cfg["num_hidden_layers"])]
    if SLIDING not in types:
        return {}
    return {"sliding_window": int(window), "layer_types": list(types)}
