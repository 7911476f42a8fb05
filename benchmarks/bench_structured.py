"""What constrained decoding costs: decode-step time of a batch of 64 sequences with 0, 8
and 64 constrained rows.

    python -m benchmarks.bench_structured [--batch 64] [--constrained 0 8 64] [--steps 16]

Each run adds `batch` requests at once (short prompts, ignore_eos, all sequences decode for
`steps` steps after their prefill). Constrained rows follow a regex whose only end is a
string no greedy model writes ("[a-z ,.]+!!!QQQ"), so none of them ends early and every
measured step has the full batch. Reported per run: mean and median decode-step time, and
the part of it spent filling and applying the grammar bitmask (the engine's own timer,
StructuredOutputManager.mask_seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from engine.llm import LLM
from engine.sampling_params import SamplingParams
from engine.structured_output import StructuredOutputSpec
from engine.types.stats import StepStats

NEVER_ENDING = StructuredOutputSpec.regex(r"[a-z ,.]+!!!QQQ")
PROMPTS = ["Tell me about the sea.", "Describe a forest at night.", "Write about a city.",
           "Explain how rivers form."]


def measure(llm: LLM, batch: int, constrained: int, steps: int) -> dict[str, Any]:
    engine = llm.engine
    for i in range(batch):
        spec = NEVER_ENDING if i < constrained else None
        params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True,
                                structured_outputs=spec)
        engine.add_request(f"b{batch}-c{constrained}-{i}", PROMPTS[i % len(PROMPTS)], params)
    times: list[float] = []
    masks: list[float] = []
    masked_before = engine.structured.mask_seconds  # the engine's own mask timer, at the step's start

    def keep_full_decodes(step: StepStats) -> None:
        nonlocal masked_before
        if step.num_decodes == batch and step.num_prefill_tokens == 0:
            times.append(step.step_time)
            masks.append(engine.structured.mask_seconds - masked_before)
        masked_before = engine.structured.mask_seconds

    engine.step_listeners.append(keep_full_decodes)
    try:
        while engine.has_unfinished():
            engine.step()
    finally:
        engine.step_listeners.remove(keep_full_decodes)
    return {"batch": batch, "constrained": constrained, "decode_steps": len(times),
            "step_ms_mean": 1000 * statistics.mean(times),
            "step_ms_median": 1000 * statistics.median(times),
            "mask_ms_mean": 1000 * statistics.mean(masks)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--constrained", type=int, nargs="+", default=[0, 8, 64])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--kv-cache-memory", default="512MiB")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args(argv)
    llm = LLM(kv_cache_memory=args.kv_cache_memory, max_model_len=512)
    llm.engine.structured.compile(NEVER_ENDING)  # compile once, outside the timed steps
    measure(llm, 8, 8, 2)  # warm-up
    rows = [measure(llm, args.batch, c, args.steps) for c in args.constrained]
    base = rows[0]["step_ms_mean"]
    print(f"{'constrained rows':>17} {'decode steps':>12} {'step ms (mean)':>15} "
          f"{'median':>8} {'mask ms':>8} {'vs 0':>7}")
    for r in rows:
        print(f"{r['constrained']:>17} {r['decode_steps']:>12} {r['step_ms_mean']:>15.1f} "
              f"{r['step_ms_median']:>8.1f} {r['mask_ms_mean']:>8.2f} "
              f"{r['step_ms_mean'] / base:>7.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
