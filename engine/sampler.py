"""Turn the logits of a step into next tokens, per request parameters.

Greedy rows take the argmax. Sampled rows apply temperature, top-k, top-p and
min-p. A request with a seed draws from its own generator, so its output does
not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None
    blocked_ids: list[int]  # EOS / stop ids masked while min_tokens is not reached


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[tuple[float, list[tuple[int, float]]] | None]  # chosen logprob, top-N


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
    logits = logits.float()
    if any(_needs_processing(r) for r in rows):
        logits = logits.clone()
        for i, row in enumerate(rows):
            _process_row(logits[i], row)
    raw_logprobs = torch.log_softmax(logits, dim=-1) if any(r.params.logprobs is not None for r in rows) else None
    chosen = logits.argmax(dim=-1)
    sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
    if sampled:
        picks = _sample_rows(logits[sampled], [rows[i] for i in sampled])
        chosen[sampled] = picks
    token_ids = chosen.tolist()
    return SampleResult(token_ids, _gather_logprobs(raw_logprobs, token_ids, rows))


def _needs_processing(row: SamplingRow) -> bool:
    p = row.params
    return bool(p.needs_penalties or p.logit_bias or row.blocked_ids)


def _process_row(logits: torch.Tensor, row: SamplingRow) -> None:
    p = row.params
    if p.logit_bias:
        ids = torch.tensor(list(p.logit_bias), dtype=torch.long, device=logits.device)
        logits[ids] += torch.tensor(list(p.logit_bias.values()), device=logits.device)
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(row.prompt_ids) | set(row.output_ids)), dtype=torch.long,
                            device=logits.device)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and row.output_ids:
        out = torch.tensor(row.output_ids, dtype=torch.long, device=logits.device)
        counts = torch.bincount(out, minlength=logits.shape[0]).to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    if row.blocked_ids:
        logits[row.blocked_ids] = float("-inf")


def _sample_rows(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    temps = torch.tensor([r.params.temperature for r in rows], device=logits.device)
    probs = torch.softmax(logits / temps[:, None], dim=-1)
    for i, r in enumerate(rows):
        probs[i] = _filter(probs[i], r.params)
    picks = torch.empty(len(rows), dtype=torch.long, device=logits.device)
    for i, r in enumerate(rows):
        # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p.
        noise = torch.empty_like(probs[i]).exponential_(generator=r.generator)
        picks[i] = torch.argmax(probs[i] / noise)
    return picks


def _filter(probs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    if p.top_k > 0 and p.top_k < probs.shape[0]:
        kth = torch.topk(probs, p.top_k).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if p.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs  # mass strictly above each token
        drop = before > p.top_p * sorted_probs.sum()
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if p.min_p > 0.0:
        probs = torch.where(probs < p.min_p * probs.max(), torch.zeros_like(probs), probs)
    return probs


def _gather_logprobs(logprobs: torch.Tensor | None, token_ids: list[int],
                     rows: list[SamplingRow]) -> list[tuple[float, list[tuple[int, float]]] | None]:
    result: list[tuple[float, list[tuple[int, float]]] | None] = []
    for i, row in enumerate(rows):
        n = row.params.logprobs
        if logprobs is None or n is None:
            result.append(None)
            continue
        top: list[tuple[int, float]] = []
        if n > 0:
            values, ids = logprobs[i].topk(n)
            top = list(zip(ids.tolist(), values.tolist(), strict=True))
        result.append((float(logprobs[i, token_ids[i]]), top))
    return result
