"""The quantization quality gate as a table: perplexity and top-1 agreement with the fp32
model on fixed prose, for each mode and each of its kernel paths.

    python -m benchmarks.quant_quality [--text tests/data/prose.txt] [--modes int8 int4]

The measurement is the quality-gate tests' own teacher-forced reading
(benchmarks/teacher_forcing.py, through the engine's model, KV cache and attention); this only
runs it for every mode and path and prints the rows as JSON. A path is pinned by the engine's
`pinned_path`, so that each call takes the block kernel ("kernel") or the dense GEMM ("gemm").
Run it from the repository root.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.teacher_forcing import Reading, read_text
from engine.llm import LLM
from engine.quant.linear import Path as KernelPath
from engine.quant.linear import pinned_path

PATHS: tuple[KernelPath | None, ...] = ("kernel", "gemm", None)  # None: the layer's own crossover
DEFAULT_TEXT = Path(__file__).resolve().parents[1] / "tests" / "data" / "prose.txt"


def load(model: str | None, mode: str) -> LLM:
    return LLM(model=model, quantization=mode, kv_cache_memory="256MiB", max_model_len=1024)


def read(llm: LLM, ids: list[int]) -> Reading:
    return read_text(llm.engine.runner, llm.engine.block_manager, ids)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--modes", nargs="+", default=["int8", "int4"])
    ap.add_argument("--model", default=None)
    args = ap.parse_args(argv)
    base = load(args.model, "none")
    ids = list(base.tokenizer(args.text.read_text()).input_ids)
    ref = read(base, ids)
    rows = [{"mode": "none", "path": "fp32", "perplexity": round(ref.perplexity, 4), "agreement": 1.0}]
    del base
    for mode in args.modes:
        llm = load(args.model, mode)
        for path in PATHS:
            with pinned_path(llm.engine.runner.model, path):
                got = read(llm, ids)
            rows.append({"mode": mode, "path": path or "auto", "perplexity": round(got.perplexity, 4),
                         "ppl_vs_fp32": round(got.perplexity / ref.perplexity - 1, 4),
                         "agreement": round(got.agreement(ref), 4)})
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"tokens": len(ids), "positions": len(ids) - 1, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
