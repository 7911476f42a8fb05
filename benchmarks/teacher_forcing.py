"""Teacher-forced reading of a text: the next-token log-likelihood and the top-1 prediction
at every position, the measure of the quality gates (perplexity, and top-1 agreement with a
reference model such as the fp32 one).

Every position is read through the engine's own model, KV cache and attention, in
independent windows (each a fresh sequence prefilled in chunks, so that attention reads
earlier chunks back from the cache). The caller hands in the token ids: the gate's text is
the caller's. The quality gates of the quantized modes and of the int8 KV cache (in tests/)
and `python -m benchmarks.quant_quality` take the same measure, so it lives with the
benchmarks, where both read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.core.block_manager import BlockManager
from engine.core.scheduler import ScheduledSeq
from engine.core.sequence import Sequence
from engine.runner.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.types.outputs import RequestTimes


@dataclass
class Reading:
    nll: torch.Tensor  # [T - 1] negative log-likelihood of each next token
    argmax: torch.Tensor  # [T - 1] the model's top-1 prediction at each position

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll.mean().item())

    def agreement(self, other: Reading) -> float:
        return (self.argmax == other.argmax).float().mean().item()


@torch.inference_mode()
def read_text(runner: ModelRunner, blocks: BlockManager, token_ids: list[int], window: int = 512,
              chunk: int = 256) -> Reading:
    """Teacher-forced next-token log-probs and argmaxes over `token_ids`, read in independent
    windows of `window` tokens (each a fresh sequence, prefilled in chunks of `chunk`), with
    cache blocks taken from (and given back to) `blocks`."""
    readings = [read_window(runner, blocks, token_ids[s:s + window + 1], chunk)
                for s in range(0, len(token_ids) - 1, window)]
    return Reading(torch.cat([r.nll for r in readings]), torch.cat([r.argmax for r in readings]))


def read_window(runner: ModelRunner, blocks: BlockManager, token_ids: list[int], chunk: int) -> Reading:
    seq = Sequence("teacher-forced", list(token_ids), SamplingParams(max_tokens=1), RequestTimes(0.0))
    blocks.allocate(seq, len(token_ids))
    nlls, argmaxes = [], []
    try:
        for start in range(0, len(token_ids) - 1, chunk):
            n = min(chunk, len(token_ids) - 1 - start)
            seq.num_computed_tokens = start
            inputs = runner.prepare([ScheduledSeq(seq, n)])
            hidden = runner.model(inputs.input_ids, inputs.positions, inputs.meta, runner.kv_caches)
            logprobs = torch.log_softmax(runner.model.compute_logits(hidden).float(), dim=-1)
            targets = torch.tensor(token_ids[start + 1:start + 1 + n])
            nlls.append(-logprobs.gather(1, targets.unsqueeze(1)).squeeze(1))
            argmaxes.append(logprobs.argmax(dim=-1))
    finally:
        blocks.free(seq)
    return Reading(torch.cat(nlls), torch.cat(argmaxes))
