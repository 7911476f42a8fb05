"""Prompt logprobs, computed during prefill (chunked prefill included).

A request that asks for them reads its whole prompt itself: it skips the prefix cache at
admission (its blocks are still published for others), since a cached block's positions
never pass through the model. Each step, the packed rows of its prompt positions are put
in front of the rows the runner computes logits for; their logits are split off again
before sampling, and each prompt token t >= 1 gets log_softmax(logits at t-1)[t] in fp32,
from the raw logits (before penalties, bias and grammar masks). After a preemption the
prompt's logprobs are already known, so the recompute neither collects them again nor
skips the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.core.request_state import RequestState
from engine.core.scheduler import ScheduledSeq
from engine.core.sequence import Sequence
from engine.runner.logprob_values import finite_logprob
from engine.runner.model_runner import StepInputs
from engine.types.outputs import TokenLogprob


@dataclass
class PromptRows:
    seq: Sequence
    first_token: int  # the prompt index of the token the first row predicts
    num_rows: int


def plan(requests: dict[str, RequestState], scheduled: list[ScheduledSeq],
         inputs: StepInputs) -> list[PromptRows]:
    """The prompt rows this step scores, for the requests that still want prompt logprobs
    (put in front of inputs.sample_indices, in place)."""
    wanted = {rid: len(st.prompt_logprobs) - 1 for rid, st in requests.items()
              if st.prompt_logprobs is not None and not st.prompt_logprobs_sent
              and len(st.prompt_logprobs) < st.seq.num_prompt_tokens}
    if not wanted:
        return []
    return plan_rows(scheduled, inputs.seq_starts, wanted, inputs.sample_indices)


def collect(requests: dict[str, RequestState], prompt_logits: torch.Tensor, plans: list[PromptRows],
            decode: Callable[[int], str]) -> None:
    """Score the planned rows and add them to each request's prompt logprobs."""
    if not plans:
        return
    top = {p.seq.request_id: p.seq.params.prompt_logprobs or 0 for p in plans}
    for rid, scored in score(prompt_logits, plans, top, decode).items():
        state = requests[rid]
        assert state.prompt_logprobs is not None
        state.prompt_logprobs.extend(scored)
        if len(state.prompt_logprobs) == state.seq.num_prompt_tokens:
            state.seq.skip_prefix_cache = False  # a recompute may use the cache again


def plan_rows(scheduled: list[ScheduledSeq], query_starts: list[int], wanted: dict[str, int],
              sample_indices: list[int]) -> list[PromptRows]:
    """Put the prompt rows of the sequences in `wanted` (request id -> the first position not
    scored yet) in front of sample_indices, in place; return where they come from."""
    plans: list[PromptRows] = []
    rows: list[int] = []
    for j, s in enumerate(scheduled):
        seq = s.seq
        if seq.request_id not in wanted:
            continue
        lo = seq.num_computed_tokens
        hi = min(lo + s.num_new_tokens, seq.num_prompt_tokens - 1)  # rows predicting prompt
        lo = max(lo, wanted[seq.request_id])  # positions already collected are skipped
        if hi <= lo:
            continue
        start = query_starts[j] + lo - seq.num_computed_tokens
        rows.extend(range(start, start + hi - lo))
        plans.append(PromptRows(seq, lo + 1, hi - lo))
    sample_indices[:0] = rows
    return plans


def split_logits(logits: torch.Tensor, plans: list[PromptRows]) -> tuple[torch.Tensor, torch.Tensor]:
    n = sum(p.num_rows for p in plans)
    return logits[:n], logits[n:]


def score(prompt_logits: torch.Tensor, plans: list[PromptRows], num_top: dict[str, int],
          decode: Callable[[int], str]) -> dict[str, list[TokenLogprob]]:
    """Each plan's new prompt logprobs, with top alternatives and the token's rank; every
    value JSON can carry (finite_logprob), as the sampled tokens' are."""
    if not plans:
        return {}
    logprobs = torch.log_softmax(prompt_logits.float(), dim=-1)
    result: dict[str, list[TokenLogprob]] = {}
    row = 0
    for plan in plans:
        seq, k = plan.seq, num_top[plan.seq.request_id]
        ids = seq.token_ids[plan.first_token:plan.first_token + plan.num_rows]
        part = logprobs[row:row + plan.num_rows]
        row += plan.num_rows
        index = torch.tensor(ids, dtype=torch.long, device=part.device)
        chosen = part.gather(1, index[:, None])[:, 0]
        ranks = (part > chosen[:, None]).sum(dim=1) + 1
        tops = part.topk(k, dim=-1) if k > 0 else None
        out = []
        for i, token in enumerate(ids):
            top = [] if tops is None else [
                (t, decode(t), finite_logprob(v))
                for t, v in zip(tops.indices[i].tolist(), tops.values[i].tolist(), strict=True)]
            out.append(TokenLogprob(token, decode(token), finite_logprob(float(chosen[i])), top,
                                    int(ranks[i])))
        result[seq.request_id] = out
    return result
