"""`pagode serve`: the OpenAI-compatible server on one model.

    pagode serve --port 8000 --kv-cache-memory 1GiB --max-num-queued-reqs 64
    python -m server.cli serve --help
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from collections.abc import Sequence

import uvicorn

from engine.arg_utils import add_engine_flags, engine_config
from engine.config import EngineConfig
from engine.model.hub import HubError
from planner.calibrate import calibrated_batch_cap, fit_path_for
from planner.cli import add_plan_flags, run_plan
from server import settings as server_settings
from server.app import create_app
from server.hub_command import NAME_HELP, add_pull_command, add_revision_flag, run_pull
from server.middleware.cors import add_cors_flags, cors_settings
from server.middleware.http_limits import timed_h11_protocol
from server.runtime.served_model import ModelSpec
from server.runtime.shutdown import DrainingServer
from server.serve_models import add_model_flags, load_limits, model_entries

log = logging.getLogger("pagode.server")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """ServerSettings' own flags (server/settings.py), then how the process listens and logs."""
    group = server_settings.add_flags(parser)["server"]
    add_cors_flags(group)
    group.add_argument("--host", default="127.0.0.1", help="address to bind")
    group.add_argument("--port", type=int, default=8000, help="port to bind")
    group.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                       help="logging level of the server and the engine")
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
        description="Serve a model, or several, with the OpenAI-compatible API (/v1/completions, "
        "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics).",
        formatter_class=HelpFormatter, conflict_handler="resolve")
    serve.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                       help=f"the model, as --model: a local path or {NAME_HELP}")
    add_server_flags(serve)
    engine_group = add_engine_flags(serve)
    add_revision_flag(engine_group)
    add_model_flags(serve, engine_group)  # --model and --served-model-name, repeatable
    add_plan_flags(commands.add_parser(
        "plan", help="capacity planning: KV memory, step-time fit, predicted latencies",
        formatter_class=HelpFormatter))
    add_pull_command(commands)
    return parser


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    setup_logging(args.log_level)
    try:
        entries = model_entries(args)
    except HubError as exc:
        log.error("%s", exc)
        return 1
    except ValueError as exc:
        parser.error(str(exc))
    try:
        configs = [engine_config(argparse.Namespace(**{**vars(args), "model": entry.model})) for entry in entries]
        settings = server_settings.from_args(argparse.Namespace(**{**vars(args), "served_model_name": entries[0].name}),
                                             url=f"http://{args.host}:{args.port}", cors=cors_settings(args))
        limits = load_limits(args)
    except ValueError as exc:
        parser.error(str(exc))
    for config in configs:
        size_batch(config, args)
    several = [ModelSpec(entry.name, config) for entry, config in zip(entries, configs, strict=True)]
    app = create_app(settings, engine_config=configs[0], models=several if len(several) > 1 else None,
                     limits=limits)
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
    server = DrainingServer(uv_config, lambda: state, settings.shutdown_timeout)
    state.on_fatal = server.request_exit
    # What is imported by now (torch, transformers, the server: a quarter of a million objects)
    # lives as long as the process: frozen out of the collector, a full collection while
    # serving no longer walks it (80-90 ms a pass with the default model, a pause between
    # decode steps), nor do the collections at exit (a stop took 0.7 s, 0.35 s frozen). The
    # models load after this point, so that one unloaded later is still collected.
    gc.freeze()
    server.run()
    return 1 if state.load_error else 0


def size_batch(config: EngineConfig, args: argparse.Namespace) -> None:
    """Say what sizes max_num_seqs: the user's flag; else `pagode plan --calibrate`'s fit where
    one exists and no ITL target asks for a step time; else the engine, which times its
    decode steps at load (kept for later starts on this machine)."""
    if args.max_num_seqs is not None:
        if config.max_itl_ms is not None:
            log.warning("--max-itl-ms %g is ignored: --max-num-seqs %d sets the batch", config.max_itl_ms,
                        config.max_num_seqs)
            config.max_itl_ms = None
        log.info("max_num_seqs %d: set by --max-num-seqs", config.max_num_seqs)
        return
    cap = calibrated_batch_cap(config) if config.max_itl_ms is None else None
    if cap is not None:
        config.max_num_seqs = cap.max_num_seqs
        log.info("max_num_seqs %d: %s", cap.max_num_seqs, cap.reason)
        return
    config.size_batch = True
    log.info("max_num_seqs: sized at load from this machine's decode steps (no --max-num-seqs, no "
             "`pagode plan --calibrate` fit at %s)", fit_path_for(config))


def main(argv: Sequence[str] | None = None) -> int:
    """`pagode`: `serve`, `plan` or `pull`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "plan":
        return run_plan(args)
    if args.command == "pull":
        return run_pull(args)
    if args.command != "serve":
        parser.print_help()
        return 2
    return serve(args, parser)


if __name__ == "__main__":
    sys.exit(main())
