"""pagode on Ray Serve: an ingress that reads each request and computes its prompt's block
keys, and N replicas, each the whole `pagode serve` app (its routes, streaming, /health,
/metrics) over an AsyncEngine, autoscaled on ongoing requests and chosen per request by
PrefixAffinityRouter.

    serve run docker/ray/serve.yaml                      # one machine
    serve deploy docker/ray/serve.yaml --address http://HEAD:8265   # a running Ray cluster

The app builder's args (docker/ray/serve.yaml) are FleetConfig's fields; `pagode_args` are
`pagode serve` flags, given to every replica as they are."""

# No `from __future__ import annotations`: Ray pickles the ingress class by value, and FastAPI
# could not resolve string annotations (Request) against the few globals that travel with it.
import argparse
import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.config import AutoscalingConfig
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from server.api.errors import error_body
from server.fleet import replica_registry
from server.fleet.block_keys import cached_keys, prompt_keys, request_token_ids
from server.fleet.prefix_router import POLICIES
from server.fleet.relay import Lifespan, RelayRequest, ResponseHead, play
from server.fleet.replica_metrics import merge_metrics

logger = logging.getLogger("pagode.fleet")

REPLICA_DEPLOYMENT = "PagodeReplica"
ROUTING_HEADER = "x-pagode-routing"  # prefix | random: this request's routing policy
FAN_OUT_TIMEOUT_S = 30.0
READY_POLL_S = 0.2


@dataclass
class FleetConfig:
    pagode_args: list[str] = field(default_factory=list)  # `pagode serve` flags of every replica
    min_replicas: int = 1
    max_replicas: int = 2
    initial_replicas: int | None = None
    target_ongoing_requests: float = 8.0  # per replica: above it, Ray adds replicas
    max_ongoing_requests: int = 32  # per replica: past it, requests wait in the router
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_period_s: float = 30.0
    metrics_interval_s: float = 10.0
    router: str = "prefix"  # prefix | random (the default policy; a request may ask another)
    router_seed: int | None = None  # seeds the router's random choices (reproducible baselines)
    imbalanced_threshold: int = 8  # queue spread past which the least loaded replica wins
    routing_stats_period_s: float = 2.0  # how often replicas report their cached blocks
    replica_cpus: float = 1.0

    @classmethod
    def of(cls, args: dict[str, Any]) -> "FleetConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"unknown pagode Ray app args {unknown}; known: {sorted(known)}")
        config = cls(**args)
        if config.router not in POLICIES:
            raise ValueError(f"router must be one of {POLICIES}, not {config.router!r}")
        return config

    def autoscaling(self) -> AutoscalingConfig:
        return AutoscalingConfig(min_replicas=self.min_replicas, max_replicas=self.max_replicas,
                                 initial_replicas=self.initial_replicas,
                                 target_ongoing_requests=self.target_ongoing_requests,
                                 upscale_delay_s=self.upscale_delay_s, downscale_delay_s=self.downscale_delay_s,
                                 look_back_period_s=self.look_back_period_s,
                                 metrics_interval_s=self.metrics_interval_s)

    def router_config(self) -> dict[str, Any]:
        """RequestRouterConfig's fields (Ray validates the dict into one)."""
        return {"request_router_class": "server.fleet.prefix_router:PrefixAffinityRouter",
                "request_router_kwargs": {"policy": self.router, "imbalanced_threshold": self.imbalanced_threshold,
                                          "seed": self.router_seed},
                "request_routing_stats_period_s": self.routing_stats_period_s,
                "request_routing_stats_timeout_s": max(self.routing_stats_period_s, 5.0)}


def parse_pagode_args(pagode_args: list[str]) -> argparse.Namespace:
    from server.cli import build_parser
    from server.serve_models import single_model

    return single_model(build_parser().parse_args(["serve", *pagode_args]))


@serve.deployment(name=REPLICA_DEPLOYMENT, health_check_period_s=5, health_check_timeout_s=30,
                  graceful_shutdown_timeout_s=30)
class PagodeReplica:
    """One pagode server without a socket: requests come through the ingress's handle."""

    async def __init__(self, pagode_args: list[str]) -> None:  # type: ignore[misc]
        """Returns once the engine is loaded and its loop runs, so that Ray counts the
        replica as started only when it can serve."""
        from engine.arg_utils import engine_config
        from server import settings as server_settings
        from server.app import create_app
        from server.cli import setup_logging, size_batch
        from server.middleware.cors import cors_settings

        args = parse_pagode_args(pagode_args)
        setup_logging(args.log_level)
        config = engine_config(args)
        settings = server_settings.from_args(args, url=f"ray-serve replica pid {os.getpid()}",
                                             cors=cors_settings(args))
        size_batch(config, args)
        self.app = create_app(settings, engine_config=config)
        self.state = self.app.state.server
        self.lifespan = Lifespan(self.app)
        await self.lifespan.start()
        while not self.state.ready and self.state.load_error is None:
            await asyncio.sleep(READY_POLL_S)
        if self.state.load_error is not None:
            raise RuntimeError(f"the engine failed to start: {self.state.load_error}")

    async def serve(self, request: RelayRequest) -> AsyncIterator[ResponseHead | bytes]:
        async for part in play(self.app, request):
            yield part

    def check_health(self) -> None:
        """Ray replaces a replica whose check raises: one whose engine loop died."""
        problem = self.state.health_problem()
        if problem is not None and not self.state.draining:
            raise RuntimeError(problem)

    def record_routing_stats(self) -> dict[str, Any]:
        """What PrefixAffinityRouter reads: the keys of the blocks this replica's prefix
        cache holds."""
        engine = self.state.engine
        return {"block_keys": cached_keys(engine.cached_block_hashes()) if engine is not None else []}

    async def __del__(self) -> None:
        self.state.draining = True
        await self.lifespan.stop()


# Defined before the ingress: serve.ingress pickles the class (and what its methods name)
# when it is decorated.
def open_stream(replicas: DeploymentHandle, request: RelayRequest) -> DeploymentResponseGenerator:
    return cast(DeploymentResponseGenerator, replicas.options(stream=True).serve.remote(request))


def pinned(request: RelayRequest, replica: str) -> RelayRequest:
    return RelayRequest(**{**asdict(request), "replica": replica})


async def events_of(stream: DeploymentResponseGenerator) -> AsyncIterator[bytes]:
    """The SSE body's chunks; a replica lost mid-stream ends it with an error event, as
    pagode does for its own failures after the stream has started."""
    try:
        async for part in stream:
            if isinstance(part, bytes):
                yield part
    except Exception as exc:
        logger.warning("a replica failed mid-response: %r", exc)
        yield f"data: {json.dumps(error_body(503, replica_failed(exc)))}\n\n".encode()
    finally:
        # The client left before the end: stop the replica's side too, or it would count
        # as ongoing there (for routing and autoscaling) until it finished on its own.
        stream.cancel()


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


def replica_failed(exc: BaseException) -> str:
    return f"the replica serving this request failed ({type(exc).__name__})"


ingress_app = FastAPI(title="pagode on Ray Serve", docs_url=None, redoc_url=None, openapi_url=None)


@serve.deployment(name="PagodeIngress", max_ongoing_requests=1024, ray_actor_options={"num_cpus": 0})
@serve.ingress(ingress_app)
class PagodeIngress:
    """Reads the body, computes the prompt's block keys, and relays the request to the
    replica the router picks; streams the answer back as the replica sends it."""

    def __init__(self, replicas: DeploymentHandle, pagode_args: list[str], default_policy: str) -> None:
        from engine.model_tokenizer import tokenizer_for

        args = parse_pagode_args(pagode_args)
        self.replicas = replicas
        self.block_size = args.block_size  # the replicas' KV block, from the same flags
        self.default_policy = default_policy
        self.tokenizer = tokenizer_for(args.model)
        if args.chat_template:
            from server.settings import read_chat_template

            self.tokenizer.chat_template = read_chat_template(args.chat_template)

    @ingress_app.get("/metrics")
    async def metrics(self) -> Response:
        """Every replica's pagode metrics on one page, each sample labelled with its replica."""
        pages = await self.fan_out(RelayRequest("GET", "/metrics"))
        return Response(merge_metrics(pages), media_type="text/plain; version=0.0.4; charset=utf-8")

    @ingress_app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD"])
    async def relay(self, request: Request, path: str) -> Response:
        body = await request.body()
        policy = request.headers.get(ROUTING_HEADER, self.default_policy)
        if policy not in POLICIES:
            return error(400, f"{ROUTING_HEADER} must be one of {', '.join(POLICIES)}")
        keys: list[int] = []
        if request.method == "POST" and policy == "prefix":
            ids = await asyncio.to_thread(request_token_ids, self.tokenizer, request.url.path, body)
            keys = prompt_keys(ids, self.block_size)
        relayed = RelayRequest(request.method, request.url.path, request.url.query.encode(),
                               [(k.lower(), v) for k, v in request.headers.raw], body, keys, policy=policy)
        return await self.respond(relayed)

    async def respond(self, relayed: RelayRequest) -> Response:
        stream = open_stream(self.replicas, relayed)
        try:
            head = await stream.__anext__()
        except Exception as exc:
            logger.warning("%s %s failed on its replica: %r", relayed.method, relayed.path, exc)
            return error(503, f"{replica_failed(exc)}; retry")
        assert isinstance(head, ResponseHead)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers
                   if k.lower() not in (b"content-length", b"transfer-encoding")}
        if headers.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(events_of(stream), status_code=head.status, headers=headers)
        # A whole body is read before its status goes out: a replica lost between the head
        # and the body would otherwise leave the client a 200 with nothing after it.
        try:
            body = b"".join([part async for part in stream if isinstance(part, bytes)])
        except Exception as exc:
            logger.warning("%s %s failed on its replica mid-response: %r", relayed.method, relayed.path, exc)
            return error(503, f"{replica_failed(exc)}; retry")
        finally:
            stream.cancel()  # a client gone before the end stops the replica's side too
        return Response(body, status_code=head.status, headers=headers)

    async def fan_out(self, request: RelayRequest) -> dict[str, str]:
        """Send `request` to each replica the router knows; their bodies by replica id."""
        if not replica_registry.known(REPLICA_DEPLOYMENT):
            await self.collect(request)  # the handle's router starts with a first request
        # One after the other: the calls made while serving one HTTP request share its internal
        # request id, and Ray's router matches a routed replica to its waiting call by that id.
        bodies: dict[str, str] = {}
        for rid in replica_registry.known(REPLICA_DEPLOYMENT):
            try:
                bodies[rid] = await self.collect(pinned(request, rid))
            except Exception as exc:
                logger.warning("replica %s did not answer %s %s: %r", rid, request.method, request.path, exc)
        return bodies

    async def collect(self, request: RelayRequest) -> str:
        async def read() -> str:
            parts = [part async for part in open_stream(self.replicas, request) if isinstance(part, bytes)]
            return b"".join(parts).decode()

        return await asyncio.wait_for(read(), FAN_OUT_TIMEOUT_S)


def build_app(args: dict[str, Any]) -> serve.Application:
    """The application `serve run` / `serve deploy` builds from the config's args."""
    config = FleetConfig.of(dict(args))
    replicas = cast(Any, PagodeReplica).options(
        autoscaling_config=config.autoscaling(), max_ongoing_requests=config.max_ongoing_requests,
        request_router_config=config.router_config(),
        ray_actor_options={"num_cpus": config.replica_cpus},
    ).bind(config.pagode_args)
    return cast(Any, PagodeIngress).bind(replicas, config.pagode_args, config.router)
