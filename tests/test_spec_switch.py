"""The load-aware switch: drafts only where they raise the step's expected tokens per second,
by a cost curve, and sequences whose drafts keep failing back off. No model needed."""

from __future__ import annotations

from engine.core.sequence import Sequence
from engine.sampling_params import SamplingParams
from engine.spec import drafter as drafter_module
from engine.spec.drafter import Drafter, StepLoad
from engine.speculative_config import parse_speculative_config
from engine.tuning.step_cost import StepCost, plausible
from engine.types.outputs import RequestTimes

SPEC = parse_speculative_config('{"num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}')
# The shape a CPU step has: flat while the weights' reads dominate, then linear in tokens.
COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
KNEE = 16
CPU_LIKE = StepCost(COUNTS, tuple(1.0 + max(0, n - KNEE) / KNEE for n in COUNTS))
COMPUTE_BOUND = StepCost(COUNTS, tuple(float(n) for n in COUNTS))


def drafter(cost: StepCost) -> Drafter:
    assert SPEC is not None
    return Drafter(SPEC, max_model_len=4096, cost=cost)


def copying_seq() -> Sequence:
    """A greedy sequence whose context repeats, so the proposer always has a full draft."""
    passage = list(range(100, 120))
    seq = Sequence("r", passage * 3 + passage[:5], SamplingParams(temperature=0, max_tokens=100), RequestTimes(0.0))
    seq.append_token(passage[5])  # one output token: decoding
    return seq


def test_one_stream_drafts_the_whole_proposal() -> None:
    d = drafter(CPU_LIKE)
    assert d.propose(copying_seq(), budget=256, load=StepLoad(tokens=1, outputs=1)) == list(range(106, 110))


def test_a_full_step_drafts_nothing() -> None:
    """Past the knee each draft token costs what a real token does; a draft that is only
    sometimes accepted would lower the step's rate, so none is made."""
    d = drafter(CPU_LIKE)
    batch = 4 * KNEE
    assert d.propose(copying_seq(), budget=256, load=StepLoad(tokens=batch, outputs=batch)) == []
    assert drafter(COMPUTE_BOUND).propose(copying_seq(), 256, StepLoad(1, 1)) == []


def test_drafts_fill_the_step_up_to_the_knee() -> None:
    """Drafts are weighed against the step as it grows: the knee caps the step, not each draft."""
    d = drafter(CPU_LIKE)
    load = StepLoad(tokens=KNEE - 6, outputs=KNEE - 6)
    drafted = []
    for _ in range(4):
        seq = copying_seq()
        draft = d.propose(seq, 256, load)
        if draft:
            d.take(seq, len(draft), load)
        drafted.append(len(draft))
    assert drafted[0] == 4 and drafted[-1] == 0
    assert load.tokens <= KNEE + 4


def test_budget_and_max_tokens_cap_the_draft() -> None:
    d = drafter(CPU_LIKE)
    assert len(d.propose(copying_seq(), budget=2, load=StepLoad(1, 1))) == 2
    seq = copying_seq()
    seq.params = SamplingParams(temperature=0, max_tokens=3)
    assert len(d.propose(seq, 256, StepLoad(1, 1))) == 1  # the token after it is the target's


def test_only_plain_greedy_requests_draft() -> None:
    d = drafter(CPU_LIKE)
    for params in (SamplingParams(temperature=0.7, max_tokens=100),
                   SamplingParams(temperature=0, max_tokens=100, speculative=False),
                   SamplingParams(temperature=0, max_tokens=100, repetition_penalty=1.2),
                   SamplingParams(temperature=0, max_tokens=100, min_tokens=5)):
        seq = copying_seq()
        seq.params = params
        assert d.propose(seq, 256, StepLoad(1, 1)) == []


def test_low_acceptance_backs_off_then_tries_again() -> None:
    d = drafter(CPU_LIKE)
    seq = copying_seq()
    while seq.spec_backoff == 0:
        d.record(seq, 4, 0)  # every draft rejected
    assert seq.spec_acceptance >= drafter_module.MIN_ACCEPTANCE  # reset for the next try
    refused = 0
    while d.propose(seq, 256, StepLoad(1, 1)) == []:
        refused += 1
    assert refused == drafter_module.BACKOFF_STEPS
    assert d.counters.num_draft_tokens > 0 and d.counters.num_accepted_tokens == 0


def test_a_sure_sequence_drafts_where_a_doubtful_one_does_not() -> None:
    """Near the knee, a sequence that has been right drafts, one that has nearly always
    been wrong does not: the rate in the weighing is the sequence's own."""
    d = drafter(CPU_LIKE)
    load = StepLoad(tokens=KNEE - 2, outputs=KNEE - 2)
    assert d.best_length(load, 4, 1.0) >= 2
    assert d.best_length(load, 4, 0.05) == 0


def test_a_draft_within_the_fused_limit_is_priced_on_the_fused_step() -> None:
    """The fused C++ step verifies drafts too, so a draft that keeps a decode-only step within
    its limit costs what the fused step costs; one that pushes the step past the limit pays
    for leaving it, and must be likely enough to land to make up for that."""
    fused = StepCost((1, 2, 4, 8), (0.3, 0.3, 0.3, 0.6))
    cost = StepCost(COUNTS, CPU_LIKE.seconds, fused=fused, fused_limit=4)
    d = drafter(cost)
    assert d.best_length(d.start_step(1, 1), 4, 0.5) == 3  # 1 + 3 fits, 1 + 4 would run general
    assert d.best_length(d.start_step(1, 1), 2, 0.2) == 2  # on the fused curve even a doubtful draft pays
    assert d.best_length(d.start_step(4, 4), 4, 1.0) == 0  # at the limit: 8 tokens in 1.0 s < 4 in 0.3 s
    assert d.best_length(d.start_step(8, 8), 4, 0.5) > 0  # past its limit the step runs general anyway
    mixed = d.start_step(3, 2)  # a prefill chunk in the step: it runs general, drafts or not
    assert not mixed.decode_only and d.best_length(mixed, 4, 0.5) == 4


def test_taking_a_draft_keeps_a_decode_only_step_on_the_fused_curve() -> None:
    fused = StepCost((1, 2, 4, 8), (0.3, 0.3, 0.3, 0.6))
    d = drafter(StepCost(COUNTS, CPU_LIKE.seconds, fused=fused, fused_limit=8))
    load = d.start_step(1, 1)
    d.take(copying_seq(), 3, load)
    assert load.decode_only and load.tokens == 4
    assert d.best_length(load, 4, 1.0) == 4  # 8 tokens still fit the fused step


def test_cost_curve_interpolates_and_extends_linearly() -> None:
    cost = StepCost((1, 2, 4), (1.0, 1.0, 2.0))
    assert cost.at(0) == cost.at(1) == 1.0
    assert cost.at(3) == 1.5
    assert cost.at(8) == 4.0


def test_a_curve_where_batching_never_pays_is_not_kept() -> None:
    """Batching shares the weight reads, so a quiet machine's curve always runs some count at
    twice one token's rate; one that does not was timed on a busy machine."""
    assert plausible(CPU_LIKE)
    assert not plausible(COMPUTE_BOUND)
