"""The batched sampler gives what sampling each row alone (the per-row reference) gives."""

from __future__ import annotations

import torch

from engine.core.sampling_row import SamplingRow
from engine.runner.sampler import apply_processors, filter_probs, first_max, sample
from engine.sampling_params import SamplingParams

VOCAB = 300


def reference_process(logits: torch.Tensor, row: SamplingRow) -> None:
    """The per-row processors, one request at a time (the sampler's former loop)."""
    p = row.params
    if p.logit_bias:
        logits[torch.tensor(list(p.logit_bias))] += torch.tensor(list(p.logit_bias.values()))
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(row.prompt_ids) | set(row.output_ids)))
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and row.output_ids:
        counts = torch.bincount(torch.tensor(row.output_ids), minlength=logits.shape[0]).float()
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
    if row.blocked_ids:
        logits[row.blocked_ids] = float("-inf")


def reference_filter(probs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    if 0 < p.top_k < probs.shape[0]:
        kth = torch.topk(probs, p.top_k).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if p.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True, stable=True)
        before = sorted_probs.cumsum(0) - sorted_probs
        sorted_probs[before > p.top_p * sorted_probs.sum()] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if p.min_p > 0.0:
        probs = torch.where(probs < p.min_p * probs.max(), torch.zeros_like(probs), probs)
    return probs


def mixed_rows(seeded: bool) -> list[SamplingRow]:
    """Greedy and sampled rows with every processor and filter, mixed in one batch."""
    specs = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, top_k=5, seed=1),
        SamplingParams(temperature=1.0, top_p=0.8, seed=2, repetition_penalty=1.3),
        SamplingParams(temperature=0, presence_penalty=0.5, frequency_penalty=0.3),
        SamplingParams(temperature=1.3, min_p=0.05, top_k=40, top_p=0.95, seed=3,
                       logit_bias={7: 5.0, 11: -100.0}),
        SamplingParams(temperature=0.9, seed=4, frequency_penalty=1.0),
        SamplingParams(temperature=0, logit_bias={42: 30.0}),
    ]
    rows = []
    for i, p in enumerate(specs):
        if not seeded and p.seed is not None:
            p = SamplingParams(**{**p.__dict__, "seed": None})
        gen = torch.Generator().manual_seed(p.seed) if p.seed is not None else None
        blocked = [0, 1] if i % 3 == 1 else []
        rows.append(SamplingRow(p, [5, 6, 7, 8, 9], [9, 9, 10, 12 + i], gen, blocked))
    return rows


def test_processors_match_per_row_reference() -> None:
    logits = torch.randn(7, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    rows = mixed_rows(seeded=True)
    batched = logits.clone()
    apply_processors(batched, rows)
    for i, row in enumerate(rows):
        expected = logits[i].clone()
        reference_process(expected, row)
        torch.testing.assert_close(batched[i], expected, atol=0, rtol=0)


def test_filters_match_per_row_reference() -> None:
    probs = torch.softmax(torch.randn(7, VOCAB, generator=torch.Generator().manual_seed(1)) * 2, -1)
    params = [r.params for r in mixed_rows(seeded=True)]
    batched = filter_probs(probs.clone(), params)
    for i, p in enumerate(params):
        torch.testing.assert_close(batched[i], reference_filter(probs[i].clone(), p), atol=0, rtol=0)


def test_mixed_batch_tokens_match_rows_sampled_alone() -> None:
    """Greedy rows and seeded rows pick the same token in the batch as alone."""
    logits = torch.randn(7, VOCAB, generator=torch.Generator().manual_seed(2)) * 3
    together = sample(logits, mixed_rows(seeded=True)).token_ids
    alone = [sample(logits[i:i + 1], [row]).token_ids[0] for i, row in enumerate(mixed_rows(seeded=True))]
    assert together == alone
    for i, row in enumerate(mixed_rows(seeded=True)):
        if row.params.greedy:
            expected = logits[i].clone()
            reference_process(expected, row)
            assert together[i] == int(expected.argmax())


def test_unseeded_rows_draw_only_what_the_filters_keep() -> None:
    logits = torch.randn(7, VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    rows = mixed_rows(seeded=False)
    for _ in range(20):
        tokens = sample(logits, rows).token_ids
        for i, row in enumerate(rows):
            if row.params.greedy:
                continue
            processed = logits[i].clone()
            reference_process(processed, row)
            probs = reference_filter(torch.softmax(processed / row.params.temperature, -1), row.params)
            assert probs[tokens[i]] > 0, f"row {i} drew a token its filters drop"


def test_first_max_is_argmax_with_ties_at_a_vocabularys_width() -> None:
    """Greedy rows take first_max: argmax's index, the first of tied maxima, on rows as wide
    as a real vocabulary (where torch's reductions split a row across threads)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 151_936, generator=g)
    for row, spots in enumerate([(5, 151_000), (70_000, 70_001), (151_935, 0), (3, 80_000, 150_000)]):
        logits[row, list(spots)] = 50.0  # ties, the first of them anywhere in the row
    logits[4] = 1.0  # a row of one value: index 0
    logits[5, 9] = float("inf")
    assert torch.equal(first_max(logits), logits.argmax(dim=-1))
    assert first_max(logits)[:5].tolist() == [5, 70_000, 0, 3, 0]
