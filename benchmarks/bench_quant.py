"""Quantization modes side by side, in one run: per-linear kernel timings, the bare model
forward at decode batches of 1-256, one-stream decode tok/s and saturation out tok/s.

    python -m benchmarks.bench_quant [--modes none int8 int4] [--kv-cache-dtypes fp32 fp16] [--batches 1 16 64 256]
    make bench-quant ARGS="--modes none int4"

Every mode is loaded in turn in the same process, so the ratios to `none` compare runs a
few minutes apart on the same machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.decode_probe import bare_forward_rate
from engine.llm import LLM
from engine.quant.formats import dequantize
from engine.quant.linear import QuantLinear
from engine.sampling_params import SamplingParams
from engine.tuning import kernel_crossover
from engine.tuning.timing import best_time
from engine.types.stats import StepStats
from loadgen.prose import prose_token_ids


def one_stream_decode(llm: LLM, prompt: list[int], new_tokens: int) -> float:
    """Decode tokens per second of one request alone (time after its first token)."""
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))[0]
    t = out.times
    assert t is not None and t.first_token is not None and t.last_token is not None
    return (len(out.outputs[0].token_ids) - 1) / (t.last_token - t.first_token)


def saturation(llm: LLM, prompts: list[list[int]], new_tokens: int) -> float:
    """Output tokens per second of decode-only steps with every request in the batch."""
    engine = llm.engine
    full: list[StepStats] = []

    def keep_full_decodes(step: StepStats) -> None:
        if step.num_decodes == len(prompts) and step.num_prefill_tokens == 0:
            full.append(step)

    engine.step_listeners.append(keep_full_decodes)
    try:
        for i, p in enumerate(prompts):
            engine.add_request(f"sat-{i}", p, SamplingParams(temperature=0, max_tokens=new_tokens,
                                                             ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    finally:
        engine.step_listeners.remove(keep_full_decodes)
    seconds = sum(s.step_time for s in full)
    return sum(s.num_generation_tokens for s in full) / seconds if seconds else 0.0


def linear_timings(llm: LLM, batches: list[int]) -> list[dict[str, Any]]:
    """Each distinct quantized shape: block kernel, fp32 BLAS and the layer's own choice, in ms."""
    rows, seen = [], set()
    for name, mod in llm.engine.runner.model.named_modules():
        if not isinstance(mod, QuantLinear) or mod.blocks is None:
            continue
        blocks = mod.blocks
        key = (blocks.kind, mod.out_features, mod.in_features)
        if key in seen:
            continue
        seen.add(key)
        dense = dequantize(blocks)
        for m in batches:
            x = torch.randn(m, mod.in_features)
            k = best_time(lambda: mod.kernel(x, mod.blocks), 5)  # type: ignore[misc, arg-type]  # noqa: B023
            f = best_time(lambda: F.linear(x, dense), 5)  # noqa: B023
            rows.append({"layer": name.split(".")[-1], "kind": key[0], "shape": f"{key[1]}x{key[2]}", "tokens": m,
                         "kernel_ms": round(k * 1e3, 3), "fp32_ms": round(f * 1e3, 3),
                         "speedup": round(f / k, 2), "picks": mod.path_for(m)})
    return rows


def bench_mode(mode: str, kv: str, args: argparse.Namespace) -> dict[str, Any]:
    llm = LLM(quantization=mode, kv_cache_dtype=kv, kv_cache_memory=args.kv_cache_memory, max_model_len=1024,
              max_num_seqs=max(args.saturation_batch, max(args.batches)))
    prompts = prose_token_ids(llm.engine.tokenize, [args.prompt_len] * args.saturation_batch, seed=0)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    result: dict[str, Any] = {"mode": mode, "kv_cache_dtype": kv}
    label = f"{mode}, {kv} KV"
    result["one_stream_decode_tok_s"] = round(one_stream_decode(llm, prompts[0], args.stream_tokens), 1)
    print(f"[{label}] one stream: {result['one_stream_decode_tok_s']} decode tok/s", flush=True)
    result["saturation_out_tok_s"] = round(saturation(llm, prompts, args.saturation_tokens), 1)
    print(f"[{label}] saturation (batch {args.saturation_batch}): {result['saturation_out_tok_s']} out tok/s",
          flush=True)
    result["bare_forward_tok_s"] = {b: round(bare_forward_rate(llm, b, args.context, args.reps), 1)
                                    for b in args.batches}
    print(f"[{label}] bare forward tok/s by decode batch (context {args.context}): "
          f"{result['bare_forward_tok_s']}", flush=True)
    if mode != "none" and kv == args.kv_cache_dtypes[0]:  # the linears do not depend on the KV dtype
        result["linears"] = linear_timings(llm, args.batches)
        result["crossovers"] = {f"{k[0]} {k[1]}x{k[2]}": v.max_kernel_tokens
                               for k, v in kernel_crossover.cached().items()}
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["none", "int8", "int4"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--context", type=int, default=128, help="context length of the bare-forward probes")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--stream-tokens", type=int, default=256)
    ap.add_argument("--saturation-batch", type=int, default=128)
    ap.add_argument("--saturation-tokens", type=int, default=32)
    ap.add_argument("--kv-cache-memory", default="1GiB")
    ap.add_argument("--kv-cache-dtypes", nargs="+", default=["auto"], help="each mode runs with each of these")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    results = [bench_mode(mode, kv, args) for mode in args.modes for kv in args.kv_cache_dtypes]
    base = next((r for r in results if r["mode"] == "none"), None)  # the ratios' reference: the first `none`
    print(f"\n{'mode':>5} {'KV':>5} {'1 stream':>9} {'ratio':>6} {'saturation':>11} {'ratio':>6}  "
          "bare forward tok/s (batch)")
    for r in results:
        s1 = r["one_stream_decode_tok_s"] / base["one_stream_decode_tok_s"] if base else float("nan")
        s2 = r["saturation_out_tok_s"] / base["saturation_out_tok_s"] if base else float("nan")
        bare = " ".join(f"{b}:{v}" for b, v in r["bare_forward_tok_s"].items())
        print(f"{r['mode']:>5} {r['kv_cache_dtype']:>5} {r['one_stream_decode_tok_s']:>9} {s1:>6.2f} "
              f"{r['saturation_out_tok_s']:>11} {s2:>6.2f}  {bare}")
    for r in results:
        for row in r.get("linears", []):
            print(f"[{r['mode']}] {row}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
