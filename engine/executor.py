"""The step's model half: run the scheduled batch on the model and sample its rows.

`execute` is the one call the engine makes between the scheduler's `schedule` and its
`update`; the planner's simulator has a timed fake of it. Failures keep their reach: an
error before sampling loses the batch (the result says so, and every scheduled request
fails), a row that cannot be sampled fails its request alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from engine.core.request_state import RequestState
from engine.core.scheduler import SchedulerOutput
from engine.core.step_result import Picked, StepResult
from engine.runner import prompt_logprobs, row_sampling
from engine.runner.model_runner import ModelRunner
from engine.structured_output import StructuredOutputError, StructuredOutputManager

log = logging.getLogger("pagode")


class Executor:
    def __init__(self, runner: ModelRunner, structured: StructuredOutputManager,
                 requests: dict[str, RequestState], logprobs_mode: str,
                 token_text: Callable[[int], str]) -> None:
        """`requests`: the engine's live requests (their sampling state), shared, not copied.
        `token_text`: how prompt logprobs name their tokens."""
        self.runner = runner
        self.structured = structured
        self.requests = requests
        self.logprobs_mode = logprobs_mode
        self.token_text = token_text

    def execute(self, out: SchedulerOutput) -> StepResult[RequestState]:
        if out.is_empty:
            return StepResult()
        to_sample = [s for s in out.scheduled if s.completes_prefill]
        start = time.monotonic()
        try:
            inputs = self.runner.prepare(out.scheduled)
            prepared = time.monotonic()
            plans = prompt_logprobs.plan(self.requests, out.scheduled, inputs)
            logits = self.runner.forward(inputs)
            prompt_logits, logits = prompt_logprobs.split_logits(logits, plans)
            prompt_logprobs.collect(self.requests, prompt_logits, plans, self.token_text)
            forwarded = time.monotonic()
            # Off the token list before sampling: penalties and bad words read the verified
            # tokens only; the draft comes back in the result, to verify.
            drafts = [s.seq.drop_draft() for s in to_sample]
            states = [self.requests[s.seq.request_id] for s in to_sample]
            # A drafted sequence has one logits row per position checked, all sampled alike.
            row_states = [st for st, d in zip(states, drafts, strict=True) for _ in range(1 + len(d))]
            raw = row_sampling.unmasked_logits(logits, row_states, self.logprobs_mode)
            dead = self.structured.apply_masks(logits, [st.grammar for st in row_states])
        except Exception as err:  # noqa: BLE001 - the result carries it: every request fails
            log.exception("step failed; failing its %d requests", len(out.scheduled))
            return StepResult([self.requests[s.seq.request_id] for s in out.scheduled], error=err)
        picks = row_sampling.sample_states(self.runner, logits, row_states, raw)
        if dead:
            fail_dead_rows(picks, dead, row_states)
        return StepResult(states, drafts, picks, prepare_time=prepared - start,
                          forward_time=forwarded - prepared, sample_time=time.monotonic() - forwarded)


def fail_dead_rows(picks: list[Picked | BaseException], dead: set[int],
                   row_states: list[RequestState]) -> None:
    """A request whose grammar allows no token at its first row fails (its other rows share
    that grammar state, so only the first is looked at)."""
    for i in dead:
        state = row_states[i]
        if i == 0 or row_states[i - 1] is not state:
            picks[i] = StructuredOutputError(
                f"the structured output's grammar allows no token after the {state.seq.num_output_tokens} "
                "generated so far: no output that begins with them matches it", "structured_outputs")
