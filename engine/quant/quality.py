"""The quality gate's measure: teacher-forced perplexity and top-1 agreement on fixed prose.

Every position of the text is read through the engine's own model, KV cache and attention
(in independent windows of 512 tokens, each prefilled in chunks); the log-probability of the true next token gives
the perplexity, and the argmax at each position is compared with the fp32 model's.

The quality-gate tests (tests/test_quantization.py, tests/test_kv_cache_dtype.py) call it;
the same table on the command line: `python -m benchmarks.quant_quality`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.core.scheduler import ScheduledSeq
from engine.core.sequence import Sequence
from engine.io.outputs import RequestTimes
from engine.llm import LLM
from engine.quant.linear import Path as KernelPath
from engine.quant.linear import QuantLinear
from engine.sampling_params import SamplingParams

DEFAULT_TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "prose.txt"


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
def read_text(llm: LLM, token_ids: list[int], window: int = 512, chunk: int = 256) -> Reading:
    """Teacher-forced next-token log-probs and argmaxes over `token_ids`, read in independent
    windows of `window` tokens (each a fresh sequence, prefilled in chunks of `chunk`)."""
    readings = [_read_window(llm, token_ids[s:s + window + 1], chunk)
                for s in range(0, len(token_ids) - 1, window)]
    return Reading(torch.cat([r.nll for r in readings]), torch.cat([r.argmax for r in readings]))


def _read_window(llm: LLM, token_ids: list[int], chunk: int) -> Reading:
    engine, runner = llm.engine, llm.engine.runner
    seq = Sequence("quality", list(token_ids), SamplingParams(max_tokens=1), RequestTimes(0.0))
    engine.block_manager.allocate(seq, len(token_ids))
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
        engine.block_manager.free(seq)
    return Reading(torch.cat(nlls), torch.cat(argmaxes))


def force_path(llm: LLM, path: KernelPath | None) -> None:
    """Pin every quantized layer to one kernel ("kernel" or "gemm"), or back to its crossover."""
    for module in llm.engine.runner.model.modules():
        if isinstance(module, QuantLinear):
            module.force = path


def text_tokens(llm: LLM, path: Path = DEFAULT_TEXT) -> list[int]:
    return list(llm.tokenizer(path.read_text()).input_ids)
