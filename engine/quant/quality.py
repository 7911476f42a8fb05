"""The quality gate's measure: teacher-forced perplexity and top-1 agreement on fixed prose.

Every position of the text is read through the engine's own model, KV cache and attention
(in independent windows of 512 tokens, each prefilled in chunks); the log-probability of the true next token gives
the perplexity, and the argmax at each position is compared with the fp32 model's.

    python -m engine.quant.quality [--text tests/data/prose.txt] [--modes int8 int4]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.llm import LLM
from engine.outputs import RequestTimes
from engine.quant.linear import QuantLinear
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledSeq
from engine.sequence import Sequence

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


def force_path(llm: LLM, path: str | None) -> None:
    """Pin every quantized layer to one kernel ("kernel" or "gemm"), or back to its crossover."""
    for module in llm.engine.runner.model.modules():
        if isinstance(module, QuantLinear):
            module.force = path  # type: ignore[assignment]


def text_tokens(llm: LLM, path: Path = DEFAULT_TEXT) -> list[int]:
    return list(llm.tokenizer(path.read_text()).input_ids)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--modes", nargs="+", default=["int8", "int4"])
    ap.add_argument("--model", default=None)
    args = ap.parse_args(argv)
    kwargs = {"model": args.model, "kv_cache_memory": "256MiB", "max_model_len": 1024}
    base = LLM(quantization="none", **kwargs)  # type: ignore[arg-type]
    ids = text_tokens(base, args.text)
    ref = read_text(base, ids)
    rows = [{"mode": "none", "path": "fp32", "perplexity": round(ref.perplexity, 4), "agreement": 1.0}]
    del base
    for mode in args.modes:
        llm = LLM(quantization=mode, **kwargs)  # type: ignore[arg-type]
        for path in ("kernel", "gemm", None):
            force_path(llm, path)
            got = read_text(llm, ids)
            rows.append({"mode": mode, "path": path or "auto", "perplexity": round(got.perplexity, 4),
                         "ppl_vs_fp32": round(got.perplexity / ref.perplexity - 1, 4),
                         "agreement": round(got.agreement(ref), 4)})
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"tokens": len(ids), "positions": len(ids) - 1, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
