"""The engine's side of structured outputs: matchers for new requests, and the per-step
mask of the constrained rows.

Unconstrained steps cost one scan of a Python list. A step with constrained rows fills
their rows of one preallocated bitmask in a single batched call (xgrammar spreads it over
threads) and applies it to those rows of the logits in place; the other rows are untouched.
`mask_seconds` adds up the time of those steps' masks, for profiles and benchmarks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from engine.structured_output.compiler import GrammarCache
from engine.structured_output.spec import StructuredOutputSpec
from engine.structured_output.state import GrammarState


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],
                 max_threads: int = 2) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stop_token_ids = sorted(stop_token_ids)
        self._max_threads = max_threads
        self._cache: GrammarCache | None = None
        self._batch: Any = None
        self._bitmask: torch.Tensor | None = None
        self.mask_seconds = 0.0  # filling and applying bitmasks, since this manager was made

    @property
    def cache(self) -> GrammarCache:
        """Built on first use: the plain path never loads xgrammar."""
        if self._cache is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self.vocab_size,
                                                      stop_token_ids=self._stop_token_ids)
            self._cache = GrammarCache(info, max_threads=self._max_threads)
        return self._cache

    def compile(self, spec: StructuredOutputSpec) -> Any:
        return self.cache.compile(spec)

    def new_state(self, spec: StructuredOutputSpec | None) -> GrammarState | None:
        if spec is None:
            return None
        import xgrammar as xgr

        return GrammarState(xgr.GrammarMatcher(self.compile(spec)))

    def apply_masks(self, logits: torch.Tensor, states: Sequence[GrammarState | None]) -> set[int]:
        """Forbid, in place, every token the grammar of row i does not allow next. Returns
        the rows whose grammar allows no token at all: a language that is empty past the
        output so far (the regex `a[^\\s\\S]` after "a"), which no sampler can follow."""
        rows = [i for i, s in enumerate(states) if s is not None and not s.is_terminated]
        if not rows:
            return set()
        import xgrammar as xgr

        start = time.perf_counter()
        bitmask = self._bitmask_for(len(states))
        matchers = [states[i].matcher for i in rows]  # type: ignore[union-attr]
        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher(max_threads=self._max_threads)
        self._batch.batch_fill_next_token_bitmask(matchers, bitmask, indices=rows)
        mask = bitmask[:len(states)].to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=self.vocab_size, indices=rows)
        alive = torch.isfinite(logits[rows, :self.vocab_size]).any(dim=1).tolist()
        self.mask_seconds += time.perf_counter() - start
        return {row for row, ok in zip(rows, alive, strict=True) if not ok}

    def _bitmask_for(self, num_rows: int) -> torch.Tensor:
        if self._bitmask is None or self._bitmask.shape[0] < num_rows:
            import xgrammar as xgr

            size = max(num_rows, 2 * (0 if self._bitmask is None else self._bitmask.shape[0]), 8)
            self._bitmask = xgr.allocate_token_bitmask(size, self.vocab_size)
        return self._bitmask
