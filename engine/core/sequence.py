"""A request's tokens and progress through the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams
from engine.types.outputs import RequestTimes


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    times: RequestTimes
    status: SequenceStatus = SequenceStatus.WAITING
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, found in the prefix cache at admission
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of full blocks; tokens never change
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    error_param: str | None = None  # set when the failure is the request's own fault (a 400)
    skip_prefix_cache: bool = False  # reads its whole prompt (prompt logprobs)
    # The LoRA adapter it runs on (None: the base model), and the root its block hashes chain
    # from, so that KV computed under one adapter is never found by another's prompt.
    lora_name: str | None = None
    cache_root: int | None = None
    # Speculative decoding: draft tokens appended to token_ids for this step only, until
    # verified (engine/spec/); the recent acceptance average and the steps left to back off.
    draft: list[int] = field(default_factory=list)
    spec_acceptance: float = 0.5  # engine/spec/drafter.py PRIOR_ACCEPTANCE
    spec_backoff: int = 0

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than the one newest token still lacks K/V (prompt, or recompute after preemption)."""
        return self.num_uncomputed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def drop_draft(self) -> list[int]:
        """Take the unverified draft tokens back off token_ids; return them."""
        draft = self.draft
        if draft:
            del self.token_ids[len(self.token_ids) - len(draft):]
            self.draft = []
        return draft

    def reset_for_recompute(self) -> None:
        """Preempted: K/V dropped; the tokens so far become the prompt to read again."""
        self.drop_draft()
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table = []
        self.status = SequenceStatus.WAITING
