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

from engine import arg_utils as engine_args
from engine import envs
from engine.arg_utils import default_of
from engine.config import EngineConfig
from engine.io.request_limits import RequestCaps
from planner import batch_cap
from planner.cli import add_plan_flags, run_plan
from server.app import create_app
from server.middleware.cors import add_cors_flags, cors_settings
from server.middleware.http_limits import timed_h11_protocol
from server.runtime.shutdown import DrainingServer
from server.runtime.state import EngineFactory
from server.settings import ServerSettings

log = logging.getLogger("pagode.server")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def server_default(name: str) -> object:
    return default_of(ServerSettings, name)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    group = engine_args.add_engine_flags(parser)
    group.add_argument("--profile-steps", type=int, default=0, metavar="N",
                       help="log a table of where the time of N engine steps goes (packing, "
                            "forward by op class, sampling, detokenize, streaming), then every N")


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """Per-request caps (engine.io.request_limits) and connection limits (server.middleware.http_limits)."""
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
    return engine_args.engine_config(args, request_caps=request_caps(args))


def request_caps(args: argparse.Namespace) -> RequestCaps:
    return RequestCaps(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RequestCaps)})


def server_settings(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        served_model_name=args.served_model_name, api_key=args.api_key or None,
        max_num_queued_reqs=args.max_num_queued_reqs, shutdown_timeout=args.shutdown_timeout,
        log_requests_text=args.log_requests_text, url=f"http://{args.host}:{args.port}",
        profile_steps=args.profile_steps, cors=cors_settings(args),
        **{name: getattr(args, name) for name in CONNECTION_SETTINGS})


CONNECTION_SETTINGS = ("max_body_bytes", "max_header_bytes", "header_timeout_s", "body_timeout_s",
                       "sse_send_timeout_s", "limit_concurrency", "timeout_keep_alive_s")


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser,
          engine_factory: EngineFactory | None = None) -> int:
    setup_logging(args.log_level)
    try:
        config, settings = engine_config(args), server_settings(args)
    except ValueError as exc:
        parser.error(str(exc))
    size_batch(config, args)
    app = create_app(settings, engine_config=config, engine_factory=engine_factory)
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


def size_batch(config: EngineConfig, args: argparse.Namespace) -> None:
    """Say what max_num_seqs is and why; unless the user set it, size it from the step fit."""
    if args.max_num_seqs is not None:
        log.info("max_num_seqs %d: set by --max-num-seqs", config.max_num_seqs)
        return
    cap = batch_cap.choose(config)
    config.max_num_seqs = cap.max_num_seqs
    log.info("max_num_seqs %d: %s", cap.max_num_seqs, cap.reason)


def main(argv: Sequence[str] | None = None, engine_factory: EngineFactory | None = None) -> int:
    """`pagode`; `engine_factory` builds the engine from its config (AsyncEngine by default)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "plan":
        return run_plan(args)
    if args.command != "serve":
        parser.print_help()
        return 2
    return serve(args, parser, engine_factory)


if __name__ == "__main__":
    sys.exit(main())
