"""One HTTP request carried through a Ray handle to a replica, and played there against
pagode's own ASGI app in process: the replica serves exactly the routes `pagode serve` does,
streaming included, without a socket of its own.

Ray's HTTP proxy routes before the body is read, so a router that must see the prompt sits
behind an ingress that reads the body and calls the replicas through a handle with this
request; the response comes back as a head, then body chunks, as the app sends them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
ASGIApp = Any  # a Starlette/FastAPI app: await app(scope, receive, send)


@dataclass
class RelayRequest:
    method: str
    path: str
    query: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    block_keys: list[int] = field(default_factory=list)  # the prompt's full blocks (block_keys.py)
    replica: str | None = None  # a replica's unique id: only it may serve this (fan-outs)
    policy: str | None = None  # the router's policy for this request; None: the deployment's


@dataclass
class ResponseHead:
    status: int
    headers: list[tuple[bytes, bytes]]


def http_scope(request: RelayRequest) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": request.method, "scheme": "http", "path": request.path, "raw_path": request.path.encode(),
            "query_string": request.query, "root_path": "", "headers": request.headers,
            "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80)}


async def play(app: ASGIApp, request: RelayRequest) -> AsyncIterator[ResponseHead | bytes]:
    """Run `request` through `app`; yield the response head, then each body chunk. Closing
    the generator early (the client went away) tells the app so, as a socket would."""
    sent: asyncio.Queue[Message] = asyncio.Queue()
    disconnected = asyncio.Event()
    body_given = False

    async def receive() -> Message:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await sent.put(message)

    async def run() -> None:
        try:
            await app(http_scope(request), receive, send)
        finally:
            await sent.put({"type": "relay.done"})

    task = asyncio.create_task(run(), name=f"relay {request.method} {request.path}")
    try:
        while True:
            message = await sent.get()
            kind = message["type"]
            if kind == "http.response.start":
                yield ResponseHead(message["status"], list(message.get("headers", [])))
            elif kind == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    break
            elif kind == "relay.done":
                break
    finally:
        disconnected.set()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), timeout=5.0)
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


class Lifespan:
    """The ASGI lifespan of an app run without a server: startup (pagode loads its engine in
    the background then) and shutdown (the engine stops)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.outbox: asyncio.Queue[Message] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.app({"type": "lifespan", "asgi": {"version": "3.0"}},
                                                 self.inbox.get, self.outbox.put))
        await self.inbox.put({"type": "lifespan.startup"})
        await self.expect("lifespan.startup.complete")

    async def stop(self) -> None:
        if self.task is None or self.task.done():
            return
        await self.inbox.put({"type": "lifespan.shutdown"})
        await self.expect("lifespan.shutdown.complete")

    async def expect(self, kind: str) -> None:
        message = await self.outbox.get()
        if message["type"] != kind:
            raise RuntimeError(f"the app's lifespan answered {message}")
