"""CORS, with vLLM's flags: --allowed-origins, --allowed-methods, --allowed-headers (JSON
lists, default ["*"]) and --allow-credentials (default off), through Starlette's
CORSMiddleware. Browsers get the headers they need; a preflight is answered before the API
key check, as it carries no credentials."""

from __future__ import annotations

import argparse
import json
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware


def json_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError('expected a JSON list of strings, e.g. ["*"]')
    return value


def add_cors_flags(group: Any) -> None:
    group.add_argument("--allowed-origins", type=json_list, default=["*"],
                       help='CORS: allowed origins, a JSON list')
    group.add_argument("--allowed-methods", type=json_list, default=["*"],
                       help="CORS: allowed methods, a JSON list")
    group.add_argument("--allowed-headers", type=json_list, default=["*"],
                       help="CORS: allowed headers, a JSON list")
    group.add_argument("--allow-credentials", action="store_true",
                       help="CORS: allow credentials")


def cors_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"allow_origins": args.allowed_origins, "allow_methods": args.allowed_methods,
            "allow_headers": args.allowed_headers, "allow_credentials": args.allow_credentials,
            "expose_headers": ["X-Request-Id"]}


def install_cors(app: FastAPI, options: dict[str, Any]) -> None:
    if options:
        app.add_middleware(CORSMiddleware, **options)
