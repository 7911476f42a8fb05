"""The step's last stage: turn what the scheduler's update gave each request into the
outputs the engine hands back (new text, logprobs with their token texts, the finish), and
let the finished requests go.

Stop rules are not decided here: a stop string ends a request in the update, at the token
that completes it (RequestState.append), so no request runs a step past its end.
"""

from __future__ import annotations

from engine.core.request_state import RequestState
from engine.core.step_result import RowLogprob, SeqUpdate
from engine.observers.stats_recorder import finished_request_stats
from engine.runner.logprob_values import finite_logprob
from engine.tokenizer import Tokenizer
from engine.types.outputs import StreamDelta, TokenLogprob
from engine.types.stats import FinishedRequestStats


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, requests: dict[str, RequestState]) -> None:
        """`requests`: the engine's live requests; a finished one leaves it here."""
        self.tokenizer = tokenizer
        self.requests = requests

    def process(self, updates: list[SeqUpdate[RequestState]]
                ) -> tuple[list[StreamDelta], list[FinishedRequestStats]]:
        """One delta per updated request, and the stats of those that finished."""
        deltas = []
        finished = []
        for u in updates:
            deltas.append(self.delta(u.request, u.token_ids, u.logprobs))
            if u.request.seq.finish_reason is not None:
                finished.append(finished_request_stats(u.request))
        return deltas, finished

    def delta(self, state: RequestState, token_ids: list[int],
              logprobs: list[RowLogprob] | None = None) -> StreamDelta:
        if state.seq.finish_reason is not None:
            self.requests.pop(state.seq.request_id, None)
        texts = None if logprobs is None else [self._logprob(t, lp) for t, lp in zip(token_ids, logprobs, strict=True)]
        return state.delta(token_ids, texts)

    def _logprob(self, token: int, lp: RowLogprob) -> TokenLogprob:
        top = [(i, self.token_text(i), finite_logprob(v)) for i, v in lp[1]]
        return TokenLogprob(token, self.token_text(token), finite_logprob(lp[0]), top)

    def token_text(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id], clean_up_tokenization_spaces=False))
