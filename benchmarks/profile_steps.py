"""Where a decode step's time goes, at given batch sizes: `make profile-steps`.

    python -m benchmarks.profile_steps [--batch 1 64] [--context 256] [--steps 16] [--kv-cache-dtype auto]
                                       [--speculative-config JSON]

For each batch size, that many greedy requests of `context` prompt tokens run with
ignore_eos; once all have their first token, N pure decode steps are profiled
(engine/observers/profiler.py) and the table is printed. The serving path's own share (SSE and
JSON encoding) is added by `pagode serve --profile-steps N`. With --speculative-config the
prompts repeat one random passage, so that n-gram drafts find matches, and the table ends
with the drafts per step, the acceptance rate and the mean acceptance length.
"""

from __future__ import annotations

import argparse
import random

import torch

from engine.arg_utils import speculative_flag
from engine.llm import LLM
from engine.sampling_params import SamplingParams


def profile_batch(llm: LLM, batch: int, context: int, steps: int) -> str:
    """The profile table of `steps` decode steps that each hold all `batch` requests.

    The requests get no output limit short of the context window: the first ones admitted
    decode while the last ones prefill, and with a short limit they would finish inside the
    profiled window, leaving a smaller batch than the one named. They are aborted after it."""
    engine = llm.engine
    rng = random.Random(batch)
    params = SamplingParams(temperature=0, max_tokens=engine.describe().max_model_len - context,
                            ignore_eos=True)
    repeat = engine.scheduler.drafter is not None
    for i in range(batch):
        engine.add_request(f"profile-{batch}-{i}", prompt_ids(rng, context, repeat), params)
    while any(r.seq.num_output_tokens == 0 for r in engine.requests.values()):
        engine.step()
    engine.step()  # warm-up at this batch shape
    tables: list[str] = []
    profiler = engine.enable_step_profile(steps, tables.append)
    try:
        while not tables:
            engine.step()
    finally:
        profiler.close()
        engine.step_listeners.remove(profiler.on_step)
    for request_id in list(engine.requests):
        engine.abort_request(request_id)
    return tables[0]


def prompt_ids(rng: random.Random, context: int, repeat: bool) -> list[int]:
    """Random tokens; when speculating, one random passage said over and over, to copy."""
    if not repeat:
        return [rng.randrange(1000, 9000) for _ in range(context)]
    passage = [rng.randrange(1000, 9000) for _ in range(32)]
    return (passage * (context // 32 + 1))[:context]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--quantization", default="none", help="auto, none, int8 or int4")
    ap.add_argument("--model", default=None)
    ap.add_argument("--speculative-config", type=speculative_flag, default=None, metavar="JSON",
                    help="as pagode serve's (docs/speculative.md)")
    args = ap.parse_args(argv)
    llm = LLM(model=args.model, kv_cache_memory="1GiB", max_model_len=2048, kv_cache_dtype=args.kv_cache_dtype,
              quantization=args.quantization, speculative_config=args.speculative_config)
    print(f"torch threads {torch.get_num_threads()}, quantization {args.quantization}, "
          f"KV cache {llm.engine.describe().kv_cache_dtype}, "
          f"context {args.context}")
    for batch in args.batch:
        print(f"\n== decode batch {batch} ==")
        print(profile_batch(llm, batch, args.context, args.steps), flush=True)


if __name__ == "__main__":
    main()
