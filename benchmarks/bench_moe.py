"""Decode tokens/s of a random-weight Qwen3-MoE against two dense Qwen3s: one whose MLP is as
wide as the MoE's active experts (top-k x expert width) and one as wide as all its experts.

Grouping tokens by expert reads each active expert's weights once per step, so with a batch
of decodes the MoE should run near the active-size model and well ahead of the all-experts
one; it also reports how many experts each layer touched per step. Models are built in a
temporary folder (no hub): `python -m benchmarks.bench_moe [--hidden 512] [--batch 16]`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def build(path: Path, moe: bool, width: int, args: argparse.Namespace) -> None:
    import transformers

    common = dict(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=args.hidden // 8, vocab_size=512, max_position_embeddings=1024)
    if moe:
        cfg = transformers.Qwen3MoeConfig(**common, intermediate_size=width, moe_intermediate_size=width,
                                          num_experts=args.experts, num_experts_per_tok=args.top_k,
                                          norm_topk_prob=True)
        model: Any = transformers.Qwen3MoeForCausalLM(cfg)
        with torch.no_grad():  # a zero router sends every token to the same experts
            for layer in model.model.layers:
                layer.mlp.gate.weight.normal_(0, 0.5)
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, intermediate_size=width))
    model.save_pretrained(path)
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(512)}
    tokenizer: Any = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0")),
                                        unk_token="w0")
    tokenizer.save_pretrained(path)


def decode_rate(path: Path, args: argparse.Namespace) -> float:
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    llm = LLM(model=str(path), max_model_len=256, kv_cache_memory="64MiB", kv_cache_dtype="fp32",
              quantization=args.quantization)
    prompts = [[1 + (7 * i + j) % 500 for j in range(16)] for i in range(args.batch)]
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    best = float("inf")
    for _ in range(3):  # best of three: the machine may be shared
        start = time.perf_counter()
        llm.generate(prompts, params)
        best = min(best, time.perf_counter() - start)
    return args.batch * args.tokens / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--width", type=int, default=512, help="each expert's intermediate size")
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--quantization", default="none")
    args = parser.parse_args()
    torch.manual_seed(0)
    models = {"moe": (True, args.width),
              f"dense, active width {args.top_k * args.width}": (False, args.top_k * args.width),
              f"dense, all-experts width {args.experts * args.width}": (False, args.experts * args.width)}
    with tempfile.TemporaryDirectory() as tmp:
        for label, (moe, width) in models.items():
            path = Path(tmp) / label.split(",")[0].replace(" ", "-") / str(width)
            build(path, moe, width, args)
            print(f"{label:40s} {decode_rate(path, args):8.1f} tokens/s "
                  f"(batch {args.batch}, {args.quantization})", flush=True)


if __name__ == "__main__":
    main()
