"""Which dense GEMM runs a layer's big steps, by a race at load on this CPU.

The candidates are the ones engine/quant/gemms.py builds (fp32 BLAS, fp32 on oneDNN, bf16
on oneDNN where the CPU has bf16 dot products). The race (timing.py) times them on
RACE_TOKENS tokens, one thread, best of a few runs, once per weight shape, and later starts
on the same machine read the winner back (race_memory.py) and build only it; the losers'
copies are dropped, so an fp32 copy of the weights stays only where an fp32 GEMM wins.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TypeVar

import torch

from engine import native
from engine.tuning import race_memory, timing

log = logging.getLogger("pagode")

RACE = "big-step-gemm"  # race_memory's name for these results
RACE_TOKENS = 64  # a serving step's size, where big-step GEMMs take over from the block kernel
# A taller weight (an lm_head of 150k rows) is raced on its first rows: every row costs the
# same, and building three candidates of the whole matrix to time them cost seconds a start.
RACE_ROWS = 8192

_winners: dict[tuple[int, int, tuple[str, ...]], str] = {}  # (N, K, candidates) -> the winner's name

G = TypeVar("G")  # a GEMM object: called on activations [M, K]
Rows = Callable[[int | None], torch.Tensor]  # a weight's first n rows in fp32 (None: all of them)


def bf16_can_win() -> bool:
    """The CPU has bf16 dot products and the ISA cap lets pagode use them: elsewhere oneDNN
    emulates bf16 and it never wins, so it does not enter the race."""
    return native.bf16_dot_products()


def pick(out_features: int, in_features: int, names: list[str], rows: Rows, bias: torch.Tensor | None,
         shared: bool, build: Callable[[str, torch.Tensor, torch.Tensor | None, bool], G]) -> tuple[str, G | None]:
    """The winner among `names` (two or more) for this shape, and the whole weight's GEMM where
    its race built it (else None: the caller builds it, if it keeps one). The weight is asked
    for (`rows`) only where a race runs: a file's blocks are dequantized for it then, and
    never where a winner is remembered."""
    key = (out_features, in_features, tuple(names))
    if key in _winners:  # a layer of the same shape took it in this process
        return _winners[key], None
    remembered_as = ":".join(map(str, [*key[:2], *names]))
    kept = race_memory.recall(RACE, remembered_as)
    if kept in names:
        _winners[key] = kept
        log.info("big-step GEMM %dx%d: %s (of %s; measured at an earlier start)", key[0], key[1], kept,
                 ", ".join(names))
        return kept, None
    sliced = out_features > RACE_ROWS
    weight = rows(RACE_ROWS if sliced else None)
    built = {name: build(name, weight, None if bias is None else bias[:RACE_ROWS], shared) for name in names}
    _winners[key] = race(built, in_features)  # type: ignore[arg-type]
    race_memory.keep(RACE, remembered_as, _winners[key])
    log.info("big-step GEMM %dx%d: %s (of %s%s)", key[0], key[1], _winners[key], ", ".join(names),
             f"; raced on its first {RACE_ROWS} rows" if sliced else "")
    return _winners[key], None if sliced else built[_winners[key]]


def race(candidates: dict[str, Callable[[torch.Tensor], torch.Tensor]], in_features: int) -> str:
    """The fastest candidate on RACE_TOKENS random tokens, one thread, best of three."""
    x = torch.randn(RACE_TOKENS, in_features)
    winner, times = timing.fastest({name: functools.partial(gemm, x) for name, gemm in candidates.items()}, 3)
    log.debug("big-step GEMM race at %d tokens: %s", RACE_TOKENS,
              {k: round(v * 1e3, 3) for k, v in times.items()})
    return winner


def winners() -> dict[tuple[int, int], str]:
    """(N, K) -> the GEMM that won for that shape (the last race run for it)."""
    return {(n, k): name for (n, k, _), name in _winners.items()}
