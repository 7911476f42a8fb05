"""Offline throughput of the engine against the bare model forward, in one run.

    python -m benchmarks.bench_engine [--num-prompts 256] [--input-len 16:128] [--output-len 32:384]
                                      [--quantization none] [--no-transformers]

The engine serves every request at once (ignore_eos, so each generates exactly its
drawn length). Every step's batch shape and time are recorded. Then the bare
model forward (input packing, model, logits; no scheduler, sampler or
detokenizer) is timed on decode batches of the same sizes and context lengths,
on the same cache, and the two rates are compared. Last, transformers' own forward over
64 tokens per pass on the same weights and dtype is timed (benchmarks/transformers_reference.py)
and the engine's output rate is given as a ratio of it (`engine_vs_transformers_64`; the target,
with `--quantization none` and fp32 weights, is at least 1.2: docs/speed.md).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import transformers_reference
from benchmarks.decode_probe import bare_forward_rate
from engine.config import BATCHING_MODES, QUANTIZATION_MODES, EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from engine.types.stats import StepStats
from loadgen.datasets import parse_range
from loadgen.prose import prose_token_ids


@dataclass
class StepRecord:
    num_decodes: int
    num_prefill_tokens: int
    mean_seq_len: float
    seconds: float
    forward_seconds: float


def run_engine(llm: LLM, prompts: list[list[int]], outputs: list[int]) -> tuple[list[StepRecord], float, int]:
    """Serve every request at once; one record per step, from the engine's step listener."""
    engine = llm.engine
    records: list[StepRecord] = []

    def record(step: StepStats) -> None:
        records.append(StepRecord(step.num_decodes, step.num_prefill_tokens, step.mean_decode_context,
                                  step.step_time, step.forward_time))

    for i, (p, n) in enumerate(zip(prompts, outputs, strict=True)):
        engine.add_request(f"bench-{i}", p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    engine.step_listeners.append(record)
    generated = 0
    start = time.perf_counter()
    last_report = start
    try:
        while engine.has_unfinished():
            generated += sum(len(d.token_ids) for d in engine.step())
            if time.perf_counter() - last_report > 10:
                last_report = time.perf_counter()
                print(f"  {generated} tokens, {generated / (last_report - start):.1f} tok/s, "
                      f"{len(engine.scheduler.running)} running, {len(engine.scheduler.waiting)} waiting",
                      flush=True)
    finally:
        engine.step_listeners.remove(record)
    return records, time.perf_counter() - start, generated


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--input-len", default="16:128")
    ap.add_argument("--output-len", default="32:384")
    ap.add_argument("--kv-cache-memory", default="1GiB")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--batching", "--policy", dest="batching", choices=BATCHING_MODES, default="paged")
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto, fp32, fp16 or bf16")
    ap.add_argument("--quantization", default=EngineConfig.quantization,
                    choices=QUANTIZATION_MODES, help="linear-layer weights: auto, none, int8 or int4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--no-transformers", dest="transformers", action="store_false",
                    help="skip timing transformers' forward (64 tokens per pass) for the ratio")
    ap.add_argument("--plot", default=None, help="write a PNG of engine vs bare rate by batch size")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    llm = LLM(model=args.model, kv_cache_memory=args.kv_cache_memory, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, batching=args.batching, max_model_len=1024,
              kv_cache_dtype=args.kv_cache_dtype, quantization=args.quantization)
    rng = random.Random(args.seed)
    lo_in, hi_in = parse_range(args.input_len)
    lo_out, hi_out = parse_range(args.output_len)
    lengths = [rng.randint(lo_in, hi_in) for _ in range(args.num_prompts)]
    outputs = [rng.randint(lo_out, hi_out) for _ in range(args.num_prompts)]
    prompts = prose_token_ids(llm.engine.tokenize, lengths, args.seed)
    llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=8))  # warm-up
    print(f"engine: {args.num_prompts} requests, {sum(outputs)} output tokens, torch threads "
          f"{torch.get_num_threads()}", flush=True)
    records, wall, generated = run_engine(llm, prompts, outputs)
    summary = summarize(llm, records, wall, generated, args.reps)
    summary["config"] = vars(args)
    if args.transformers:
        del llm
        rate = transformers_reference.forward_rate(args.model)
        summary["transformers_forward_64_tok_s"] = round(rate, 1)
        summary["engine_vs_transformers_64"] = round(summary["output_tok_s"] / rate, 3)
    print(json.dumps({k: v for k, v in summary.items() if k != "buckets"}, indent=2))
    print_buckets(summary["buckets"])
    for path in (args.json, args.plot):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**summary, "steps": [asdict(r) for r in records]}, f, indent=2)
    if args.plot:
        plot(summary, records, args.plot)


def summarize(llm: LLM, records: list[StepRecord], wall: float, generated: int, reps: int) -> dict[str, Any]:
    decode_only = [r for r in records if r.num_prefill_tokens == 0 and r.num_decodes > 0]
    buckets: dict[int, list[StepRecord]] = defaultdict(list)
    for r in decode_only:
        buckets[_bucket(r.num_decodes)].append(r)
    rows = []
    bare_total = engine_total = 0.0
    for size in sorted(buckets):
        recs = buckets[size]
        batch = round(statistics.fmean(r.num_decodes for r in recs))
        seq_len = max(2, round(statistics.fmean(r.mean_seq_len for r in recs)))
        bare = bare_forward_rate(llm, batch, seq_len, reps)
        engine_rate = sum(r.num_decodes for r in recs) / sum(r.seconds for r in recs)
        bare_total += sum(r.num_decodes for r in recs) / bare
        engine_total += sum(r.seconds for r in recs)
        rows.append({"batch": batch, "seq_len": seq_len, "steps": len(recs),
                     "engine_tok_s": round(engine_rate, 1), "bare_forward_tok_s": round(bare, 1),
                     "ratio": round(engine_rate / bare, 3)})
    return {
        "output_tokens": generated, "seconds": round(wall, 2),
        "output_tok_s": round(generated / wall, 1),
        "steps": len(records), "decode_only_steps": len(decode_only),
        "forward_share_of_step_time": round(sum(r.forward_seconds for r in records)
                                            / sum(r.seconds for r in records), 3),
        "engine_vs_bare_forward": round(bare_total / engine_total, 3) if engine_total else None,
        "max_concurrent_seqs": llm.engine.scheduler.max_concurrent,
        "preemptions": llm.engine.stats().num_preemptions_total,
        "buckets": rows,
    }


def _bucket(n: int) -> int:
    for edge in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256):
        if n <= edge:
            return edge
    return n


def print_buckets(rows: list[dict[str, Any]]) -> None:
    print(f"{'batch':>6} {'ctx':>5} {'steps':>6} {'engine tok/s':>13} {'bare tok/s':>11} {'ratio':>6}")
    for r in rows:
        print(f"{r['batch']:>6} {r['seq_len']:>5} {r['steps']:>6} {r['engine_tok_s']:>13} "
              f"{r['bare_forward_tok_s']:>11} {r['ratio']:>6}")


def plot(summary: dict[str, Any], records: list[StepRecord], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows = summary["buckets"]
    batches = [r["batch"] for r in rows]
    left.plot(batches, [r["engine_tok_s"] for r in rows], "o-", label="engine (decode-only steps)")
    left.plot(batches, [r["bare_forward_tok_s"] for r in rows], "s--", label="bare model forward")
    left.set(xlabel="decode batch size", ylabel="output tokens/s", xscale="log",
             title="Engine vs bare forward, same run")
    left.legend()
    elapsed, clock = [], 0.0
    for r in records:
        clock += r.seconds
        elapsed.append(clock)
    right.plot(elapsed, [r.num_decodes for r in records], label="sequences decoding")
    right.plot(elapsed, [r.num_prefill_tokens for r in records], label="prefill tokens in step", alpha=0.6)
    right.set(xlabel="seconds", title=f"{summary['output_tok_s']} output tok/s overall")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
