"""Turn the logits of a step into next tokens, per request parameters, in batched ops.

Greedy rows take one argmax over the whole batch. Sampled rows apply temperature,
top-k, top-p and min-p as batched tensor ops over the rows that ask for each; the
penalties, logit bias and min_tokens masks are applied with one scatter each. Every
operation is row-wise, so a row's result never depends on its neighbours. A request
with a seed draws its noise from its own generator, so its output does not depend on
what else is in the batch; unseeded rows share one draw from the global generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.sampling_row import SamplingRow
from engine.sampling_params import SamplingParams

# What the sampler gives for one row that asked for logprobs: the chosen token's logprob and
# the top-N alternatives as (token id, logprob). The engine turns it into a TokenLogprob.
RawLogprob = tuple[float, list[tuple[int, float]]]


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[RawLogprob | None]


def sample(logits: torch.Tensor, rows: list[SamplingRow], logprobs_mode: str = "raw_logprobs",
           raw_logits: torch.Tensor | None = None) -> SampleResult:
    """Next tokens of `rows`. Logprobs are those of the model's own distribution by default
    (raw_logprobs, as vLLM V1: before bias, penalties, min_tokens and grammar masks;
    `raw_logits` holds the logits from before a grammar mask when one was applied), or of
    the distribution after them (processed_logprobs)."""
    logits = logits.float()
    wants_logprobs = any(r.params.logprobs is not None for r in rows)
    source = None
    if wants_logprobs and logprobs_mode == "raw_logprobs":
        source = logits if raw_logits is None else raw_logits.float()
    if any(_needs_processing(r) for r in rows):
        logits = logits.clone()
        apply_processors(logits, rows)
    if wants_logprobs and source is None:
        source = logits
    raw_logprobs = None if source is None else torch.log_softmax(source, dim=-1)
    chosen = first_max(logits)
    sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
    if sampled:
        chosen[sampled] = sample_rows(logits[sampled], [rows[i] for i in sampled])
    token_ids = chosen.tolist()
    return SampleResult(token_ids, _gather_logprobs(raw_logprobs, token_ids, rows))


def first_max(values: torch.Tensor) -> torch.Tensor:
    """Each row's index of its largest value, the first one where several tie: argmax's answer,
    which torch's max reduction gives several times faster on the CPU at a vocabulary's width
    (docs/speed.md)."""
    return values.max(dim=-1).indices


def _needs_processing(row: SamplingRow) -> bool:
    p = row.params
    return bool(p.needs_penalties or p.logit_bias or row.blocked_ids or row.forced_id is not None
                or p.allowed_token_ids is not None or row.banned_ids)


def _index(pairs: list[tuple[int, list[int]]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token id) tensors of every (row, ids) pair, flattened."""
    row_idx = [i for i, ids in pairs for _ in ids]
    tok_idx = [t for _, ids in pairs for t in ids]
    return (torch.tensor(row_idx, dtype=torch.long, device=device),
            torch.tensor(tok_idx, dtype=torch.long, device=device))


def apply_processors(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """Logit bias, repetition/presence/frequency penalties, min_tokens masks, allowed and
    banned tokens, and forced tokens, in place."""
    dev = logits.device
    bias = [(i, r.params.logit_bias) for i, r in enumerate(rows) if r.params.logit_bias]
    if bias:
        ri, ti = _index([(i, list(b)) for i, b in bias], dev)
        values = torch.tensor([v for _, b in bias for v in b.values()], dtype=logits.dtype, device=dev)
        logits.index_put_((ri, ti), values, accumulate=True)
    rep = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    if rep:
        _repetition_penalty(logits, rows, rep)
    pres = [i for i, r in enumerate(rows)
            if (r.params.presence_penalty or r.params.frequency_penalty) and r.output_ids]
    if pres:
        _presence_frequency_penalty(logits, rows, pres)
    blocked = [(i, r.blocked_ids) for i, r in enumerate(rows) if r.blocked_ids]
    if blocked:
        ri, ti = _index(blocked, dev)
        before = logits[ri, ti].clone()
        logits.index_put_((ri, ti), torch.tensor(float("-inf"), device=dev))
        # A grammar that can only end here (its mask left nothing but stop tokens) outranks
        # min_tokens: such a row keeps its stop tokens rather than having no token at all.
        emptied = torch.isneginf(logits).all(dim=1)[ri]
        if bool(emptied.any()):
            logits[ri[emptied], ti[emptied]] = before[emptied]
    _restrict_tokens(logits, rows)
    forced = [(i, r.forced_id) for i, r in enumerate(rows) if r.forced_id is not None]
    if forced:  # last: a forced token outranks bias, penalties and min_tokens alike, but not a
        # grammar or allowed_token_ids that rule it out (the row keeps their choice then)
        ri, ti = _index([(i, [token]) for i, token in forced], dev)
        possible = ~torch.isneginf(logits[ri, ti])
        ri, ti = ri[possible], ti[possible]
        logits[ri] = float("-inf")
        logits[ri, ti] = 0.0


def _restrict_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """vLLM's allowed_token_ids (every other token out) and bad_words (the tokens that
    would complete one out), after bias and penalties so that neither brings one back."""
    dev = logits.device
    for i, row in enumerate(rows):
        allowed = row.params.allowed_token_ids
        if allowed is not None:
            keep = torch.full((logits.shape[1],), float("-inf"), dtype=logits.dtype, device=dev)
            keep[torch.tensor(allowed, dtype=torch.long, device=dev)] = 0.0
            logits[i] += keep
    banned = [(i, r.banned_ids) for i, r in enumerate(rows) if r.banned_ids]
    if banned:
        ri, ti = _index(banned, dev)
        logits.index_put_((ri, ti), torch.tensor(float("-inf"), device=dev))


def _repetition_penalty(logits: torch.Tensor, rows: list[SamplingRow], which: list[int]) -> None:
    dev = logits.device
    seen = torch.zeros((len(which), logits.shape[1]), dtype=torch.bool, device=dev)
    ri, ti = _index([(k, rows[i].prompt_ids + rows[i].output_ids) for k, i in enumerate(which)], dev)
    seen[ri, ti] = True
    penalty = torch.tensor([rows[i].params.repetition_penalty for i in which], device=dev)[:, None]
    vals = logits[which]
    scaled = torch.where(vals > 0, vals / penalty, vals * penalty)
    logits[which] = torch.where(seen, scaled, vals)


def _presence_frequency_penalty(logits: torch.Tensor, rows: list[SamplingRow], which: list[int]) -> None:
    dev = logits.device
    counts = torch.zeros((len(which), logits.shape[1]), dtype=logits.dtype, device=dev)
    ri, ti = _index([(k, rows[i].output_ids) for k, i in enumerate(which)], dev)
    counts.index_put_((ri, ti), torch.ones(len(ti), dtype=logits.dtype, device=dev), accumulate=True)
    freq = torch.tensor([rows[i].params.frequency_penalty for i in which], device=dev)[:, None]
    pres = torch.tensor([rows[i].params.presence_penalty for i in which], device=dev)[:, None]
    logits[which] -= freq * counts + pres * (counts > 0).to(logits.dtype)


def sample_rows(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p over a batch of sampled rows, then one draw each."""
    temps = torch.tensor([r.params.temperature for r in rows], device=logits.device)
    probs = filter_probs(torch.softmax(logits / temps[:, None], dim=-1), [r.params for r in rows])
    return first_max(probs / exponential_noise(probs, rows))


def filter_probs(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Zero what top-k, then top-p, then min-p drop, for the rows that ask for each."""
    dev, vocab = probs.device, probs.shape[1]
    top_k = [i for i, p in enumerate(params) if 0 < p.top_k < vocab]
    if top_k:
        ks = torch.tensor([params[i].top_k for i in top_k], device=dev)
        sub = probs[top_k]
        kth = torch.topk(sub, int(ks.max())).values.gather(1, (ks - 1)[:, None])
        probs[top_k] = torch.where(sub < kth, torch.zeros_like(sub), sub)
    top_p = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if top_p:
        ps = torch.tensor([params[i].top_p for i in top_p], device=dev)[:, None]
        sorted_probs, order = probs[top_p].sort(dim=-1, descending=True, stable=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly above each token
        sorted_probs[before > ps * sorted_probs.sum(-1, keepdim=True)] = 0.0
        probs[top_p] = torch.zeros_like(sorted_probs).scatter_(1, order, sorted_probs)
    min_p = [i for i, p in enumerate(params) if p.min_p > 0.0]
    if min_p:
        ms = torch.tensor([params[i].min_p for i in min_p], device=dev)[:, None]
        sub = probs[min_p]
        probs[min_p] = torch.where(sub < ms * sub.max(-1, keepdim=True).values, torch.zeros_like(sub), sub)
    return probs


def exponential_noise(probs: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """E ~ Exp(1) per entry (argmax(p / E) draws from p): seeded rows from their own generator."""
    noise = torch.empty_like(probs)
    shared = [i for i, r in enumerate(rows) if r.generator is None]
    if shared:
        noise[shared] = torch.empty((len(shared), probs.shape[1]), device=probs.device).exponential_()
    for i, r in enumerate(rows):
        if r.generator is not None:
            noise[i].exponential_(generator=r.generator)
    return noise


def _gather_logprobs(logprobs: torch.Tensor | None, token_ids: list[int],
                     rows: list[SamplingRow]) -> list[RawLogprob | None]:
    result: list[RawLogprob | None] = [None] * len(rows)
    if logprobs is None:
        return result
    for i, row in enumerate(rows):
        n = row.params.logprobs
        if n is None:
            continue
        top: list[tuple[int, float]] = []
        if n > 0:
            values, ids = logprobs[i].topk(n)
            top = list(zip(ids.tolist(), values.tolist(), strict=True))
        result[i] = (float(logprobs[i, token_ids[i]]), top)
    return result
