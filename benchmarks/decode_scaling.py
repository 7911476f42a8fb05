"""What a decode step of B sequences costs against a step of one, at a real shape.

    python -m benchmarks.decode_scaling [--model qwen3-1.7b] [--batch 1 2 4 8 16 32] [--context 192]

Loads the real shape's Q4_K_M file (benchmarks/real_shapes.py; or any --model path) with the
server's defaults, and times the bare forward of a held decode batch (packing, model,
logits: benchmarks/decode_probe.py) at each batch size, in one process, so the ratios are
to a baseline of the same minute. At one token a step is a read of the weights; a batched
step that reads each weight block once for all its rows stays within a few times that.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.decode_probe import forward_seconds, held_decode_batch
from benchmarks.real_shapes import SHAPES, gguf_file
from engine.llm import LLM


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-1.7b", help=f"one of {', '.join(SHAPES)}, or a path")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--context", type=int, default=192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quantization", default="auto")
    args = ap.parse_args(argv)
    path = gguf_file(args.model) if args.model in SHAPES else Path(args.model)
    llm = LLM(model=str(path), quantization=args.quantization, max_model_len=1024, kv_cache_memory="2GiB",
              max_num_seqs=max(args.batch))
    base = None
    print(f"{path.name}: decode steps at {args.context} positions")
    print("| batch | ms / step | tok/s | step / step of 1 |\n|---:|---:|---:|---:|")
    for batch in args.batch:
        with held_decode_batch(llm, batch, args.context) as scheduled:
            seconds = forward_seconds(llm, scheduled, args.reps)
        base = base or seconds
        print(f"| {batch} | {seconds * 1e3:.1f} | {batch / seconds:.1f} | {seconds / base:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
