"""One request's row as the sampler reads it: its parameters, its tokens so far and the masks
of this step. The request's state builds it and the runner's sampler consumes it, so it
lives beside the request state, below the runner."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    params: SamplingParams
    prompt_ids: list[int]  # only read when the request has penalties
    output_ids: list[int]
    generator: torch.Generator | None
    blocked_ids: list[int]  # EOS / stop ids masked while min_tokens is not reached
    forced_id: int | None = None  # the one token allowed (a spent thinking budget's end)
    banned_ids: list[int] = field(default_factory=list)  # bad_words' last tokens at this step
