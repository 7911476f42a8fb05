"""What adapters in the mix cost the engine itself, without HTTP or a load generator: the
single-thread CPU time (`time.thread_time`, one torch thread) of the same `LLM.generate` on
base rows, on rows all on one adapter, and on rows spread over four, alternated in one
process and repeated, so that other work on a shared machine moves the ratios little.

    python -m benchmarks.lora_step_cost [--prompts 16] [--prompt-len 40] [--new-tokens 48] [--repeats 3]

The weights and adapters are bench_lora's (the default model as a bf16 folder, four random
PEFT adapters of ranks 8, 16, 8, 16), made once under --cache. Prints each mix's best time
and its throughput ratio to the base (base time / mix time).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.bench_lora import adapter_names, write_adapters
from benchmarks.bench_vs_peers import hf_folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=40)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "pagode")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    folder = hf_folder(args.cache)
    names = adapter_names()
    paths = write_adapters(folder, args.cache / "lora-bench")
    llm = LLM(str(folder), enable_lora=True, lora_modules={n: str(p) for n, p in zip(names, paths, strict=True)},
              max_loras=len(names), max_lora_rank=16, kv_cache_memory="256MiB", max_model_len=512)
    prompts = [[100 + 7 * i + j for j in range(args.prompt_len)] for i in range(args.prompts)]
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    mixes: dict[str, list[str | None]] = {
        "base": [None] * args.prompts, "1 adapter": [names[0]] * args.prompts,
        "4 adapters": [names[i % len(names)] for i in range(args.prompts)]}
    llm.generate(prompts[:2], params, lora_name=[None, names[1]])  # warm-up, untimed
    times: dict[str, list[float]] = {name: [] for name in mixes}
    for _ in range(args.repeats):
        for name, loras in mixes.items():
            start = time.thread_time()
            llm.generate(prompts, params, lora_name=loras)
            times[name].append(time.thread_time() - start)
    base = min(times["base"])
    for name, spent in times.items():
        print(f"{name:>10}: best {min(spent):.2f} s CPU of {[round(t, 2) for t in spent]}, "
              f"throughput {base / min(spent):.3f}x base")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
