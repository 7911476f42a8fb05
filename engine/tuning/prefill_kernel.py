"""Which path takes a CPU prefill chunk of one attention shape: the winner of a race, run once
per shape and process, kept per machine.

The candidates and the synthetic chunk they run on are attention's own
(engine/attention/prefill_choice.py builds them); here they are timed (timing.py, on one
thread, best of RACE_REPS) and the winner is remembered, so later starts on the same machine
read it back (race_memory.py) instead of racing again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from engine.tuning import race_memory, timing

log = logging.getLogger("pagode")

RACE_REPS = 3
RACE = "prefill-attention"  # race_memory's name for these results

_winners: dict[str, str] = {}


def winner(key: str, names: tuple[str, ...], candidates: Callable[[], dict[str, Callable[[], object]]],
           describe: str = "") -> str:
    """The fastest of `names` for the shape `key`: this process's earlier answer, an earlier
    start's, or a race of `candidates()` (built only when a race runs: they allocate a chunk
    and its cache). `describe` is what the log adds to a fresh result (the kernel body)."""
    if key in _winners:
        return _winners[key]
    kept = race_memory.recall(RACE, key)
    if kept in names:
        _winners[key] = str(kept)
        log.info("prefill attention %s: %s (measured at an earlier start)", key, kept)
        return str(kept)
    name, times = timing.fastest(candidates(), RACE_REPS)
    _winners[key] = name
    race_memory.keep(RACE, key, name)
    log.info("prefill attention %s: %s (ms: %s%s)", key, name, {k: round(v * 1e3, 2) for k, v in times.items()},
             f"; {describe}" if describe else "")
    return name
