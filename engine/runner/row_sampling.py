"""Sampling a step's rows so that one request's fault fails that request alone.

The batch is sampled in one call. A row whose parameters cannot even be turned into a
SamplingRow is set aside first; if the batched call still raises, every row is sampled by
itself, so that only the rows that raise fail and the others keep the token they would
have got in the batch (every sampler operation is row-wise).
"""

from __future__ import annotations

import logging

import torch

from engine.core.request_state import RequestState
from engine.core.sampling_row import SamplingRow
from engine.runner.model_runner import ModelRunner
from engine.runner.sampler import RawLogprob, SampleResult

log = logging.getLogger("pagode")

# One row's pick: the token and, when asked for, its logprobs.
Picked = tuple[int, RawLogprob | None]


def unmasked_logits(logits: torch.Tensor, states: list[RequestState], logprobs_mode: str) -> torch.Tensor | None:
    """A copy of the logits from before the grammar masks, when raw logprobs are wanted of a
    constrained row; None otherwise (the common case costs nothing)."""
    if logprobs_mode != "raw_logprobs":
        return None
    if any(st.grammar is not None and st.seq.params.logprobs is not None for st in states):
        return logits.clone()
    return None


def sample_states(runner: ModelRunner, logits: torch.Tensor, states: list[RequestState],
                  raw: torch.Tensor | None = None) -> list[Picked | BaseException]:
    """One pick per state, or the exception that failed that state alone."""
    rows = sampling_rows(states)
    good = [i for i, r in enumerate(rows) if not isinstance(r, BaseException)]
    picked: list[Picked | BaseException] = [
        r if isinstance(r, BaseException) else RuntimeError("not sampled") for r in rows]
    try:
        result = sample_subset(runner, logits, rows, good, raw)
        for j, i in enumerate(good):
            picked[i] = (result.token_ids[j], result.logprobs[j])
        return picked
    except Exception:  # noqa: BLE001 - find the rows at fault
        log.warning("batched sampling failed; sampling %d rows one by one", len(good))
    for i in good:
        try:
            one = sample_subset(runner, logits, rows, [i], raw)
            picked[i] = (one.token_ids[0], one.logprobs[0])
        except Exception as err:  # noqa: BLE001 - this row alone fails
            picked[i] = err
    return picked


def sampling_rows(states: list[RequestState]) -> list[SamplingRow | BaseException]:
    """Each state's SamplingRow, or the exception that building it raised."""
    rows: list[SamplingRow | BaseException] = []
    for state in states:
        try:
            rows.append(state.sampling_row())
        except Exception as err:  # noqa: BLE001 - that request alone fails
            rows.append(err)
    return rows


def sample_subset(runner: ModelRunner, logits: torch.Tensor, rows: list[SamplingRow | BaseException],
                  indices: list[int], raw: torch.Tensor | None = None) -> SampleResult:
    """Sample the rows at `indices` (all SamplingRows) of the batch's logits."""
    if not indices:
        return SampleResult([], [])
    chosen = [rows[i] for i in indices]
    assert all(isinstance(r, SamplingRow) for r in chosen)
    every = len(indices) == logits.shape[0]
    subset = logits if every else logits[indices]
    raw_subset = raw if raw is None or every else raw[indices]
    return runner.sample(subset, chosen, raw_subset)  # type: ignore[arg-type]
