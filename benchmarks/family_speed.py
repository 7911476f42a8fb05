"""One stream's decode speed of each family at one size, against Llama's.

    python -m benchmarks.family_speed [--quant Q8_0] [--families llama-135m qwen3-135m ...]

SmolLM2-135M's matrices written as each family (benchmarks/real_shapes.py,
FAMILIES_AT_ONE_SIZE: random weights, llama.cpp's converter and llama-quantize), so that
what differs is each family's own parts: Qwen3's and OLMo 2's q/k norms, Gemma 3's four
norms, GeGLU and windows, Granite's multipliers. Each is loaded with the server's defaults
and its bare decode forward of one sequence at 192 positions is timed
(benchmarks/decode_probe.py), all in one process, so the ratios are to a Llama measured the
same minute. The table says whether each family took the fused decode step.
"""

from __future__ import annotations

import argparse
import gc

from benchmarks.decode_probe import forward_seconds, held_decode_batch
from benchmarks.real_shapes import FAMILIES_AT_ONE_SIZE, gguf_file
from engine.llm import LLM
from engine.model.decode_step import FusedDecodeStep


def decode_seconds(name: str, quant: str, reps: int, context: int) -> tuple[float, bool]:
    """Seconds of one decode of one sequence, and whether it ran as the fused step."""
    llm = LLM(model=str(gguf_file(name, quant)), quantization="auto", max_model_len=1024,
              kv_cache_memory="256MiB", max_num_seqs=4)
    with held_decode_batch(llm, 1, context) as scheduled:
        seconds = forward_seconds(llm, scheduled, reps)
    fused = isinstance(llm.engine.runner.decode_step, FusedDecodeStep)
    del llm
    gc.collect()
    return seconds, fused


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES_AT_ONE_SIZE))
    ap.add_argument("--quant", default="Q8_0", help="llama-quantize's type for every file")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--context", type=int, default=192)
    args = ap.parse_args(argv)
    for name in args.families:  # build every file first, so the timings run back to back
        gguf_file(name, args.quant)
    results = {name: decode_seconds(name, args.quant, args.reps, args.context) for name in args.families}
    base = results.get("llama-135m", next(iter(results.values())))[0]
    print(f"one decode at {args.context} positions, {args.quant}, SmolLM2-135M's sizes")
    print("| family | ms / token | tok/s | × llama | fused step |\n|---|---:|---:|---:|---|")
    for name, (seconds, fused) in results.items():
        took = "yes" if fused else "no"
        print(f"| {name} | {seconds * 1e3:.2f} | {1 / seconds:.0f} | {base / seconds:.2f}× | {took} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
