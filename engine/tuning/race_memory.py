"""Load-time race results kept across starts, keyed by the machine that measured them.

Why: the races of engine/tuning/timing.py (block kernel against GEMM per layer shape, the
big-step GEMMs, the fused decode step against layer by layer) are a large share of a
start, and they answer the same on the same machine every time. A result is kept under
PAGODE_CACHE_DIR/races/, in one JSON file per machine key: the CPU model, its flags, the ISA
level the kernels target, the kernel library's build (its file name holds the hash of its
sources and flags), torch's version and thread count. So a new CPU, an ISA cap, a kernel
change or a torch upgrade each get a fresh race, and `--warmup` (or PAGODE_RACE_CACHE=0)
races again and keeps the new winners.

A file that cannot be read or written costs a race, never a start: the cache is an
optimisation, so its errors are logged and ignored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from engine import envs, native

log = logging.getLogger("pagode")

_fresh = False  # --warmup: race again this process, and overwrite what was kept
# Every result this process took, measured or read back: (race, key) -> (result, source).
_taken: dict[tuple[str, str], tuple[Any, str]] = {}


def race_again(fresh: bool) -> None:
    """Set by the engine from --warmup before it loads the model."""
    global _fresh
    _fresh = fresh


def machine() -> dict[str, Any]:
    """What a race result depends on besides its own arguments."""
    target = native.cpu_target()
    lib = native.library()
    return {"cpu": target.model, "flags": list(target.flags), "target": target.target,
            "kernels": None if lib is None else lib.path.name, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "tile_bf16": envs.TILE_BF16.get(),
            "bf16_kernel": envs.BF16_KERNEL.get()}


def path_for(described: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]
    return envs.CACHE_DIR.get() / "races" / f"{digest}.json"


def reads() -> bool:
    """Whether this process reads kept results (not under --warmup or PAGODE_RACE_CACHE=0)."""
    return not _fresh and envs.RACE_CACHE.get()


def recall(race: str, key: str) -> Any | None:
    """The kept result of `race` for `key` on this machine, or None (not kept, or --warmup)."""
    if not reads():
        return None
    kept = _read(path_for(machine())).get("races", {}).get(race, {}).get(key)
    if kept is not None:  # a result this process measured and kept stays "measured"
        _taken.setdefault((race, key), (kept, "kept"))
    return kept


def keep(race: str, key: str, result: Any) -> None:
    """Keep `result` (JSON-able) for later starts on this machine."""
    _taken[(race, key)] = (result, "measured")
    if not envs.RACE_CACHE.get():
        return
    described = machine()
    path = path_for(described)
    data = _read(path)
    data["machine"] = described
    data.setdefault("races", {}).setdefault(race, {})[key] = result
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(f.name, path)  # atomic: a concurrent start reads the old file or the new one
    except OSError as err:
        log.warning("could not keep the %s race result in %s: %s", race, path, err)


def taken() -> dict[tuple[str, str], tuple[Any, str]]:
    """What this process's races chose so far, by (race, key): the result and whether it was
    "measured" now or "kept" from an earlier start (a caller that found a kept result stale
    raced again, and its new result replaced it here)."""
    return dict(_taken)


def taken_of(races: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """This process's results of `races`, race -> key -> result: what a prepacked model keeps
    of its layers' races, so that a start from the pack can say what they chose."""
    chosen: dict[str, dict[str, Any]] = {}
    for (race, key), (result, _) in _taken.items():
        if race in races:
            chosen.setdefault(race, {})[key] = result
    return chosen


def retake(results: dict[str, dict[str, Any]]) -> None:
    """Results read back from elsewhere than this file (a prepacked model's), taken as kept."""
    for race, by_key in results.items():
        for key, result in by_key.items():
            _taken.setdefault((race, key), (result, "kept"))


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("ignoring the race cache %s: %s", path, err)
        return {}
    return data if isinstance(data, dict) else {}
