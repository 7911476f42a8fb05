#!/usr/bin/env python3
"""Start vllm-router with one worker URL per replica, found by DNS as nginx finds them.

A scaled compose service (`deploy.replicas: N`) is one DNS name with N addresses. nginx
turns such a name into N upstream servers when it starts; vllm-router would take it as a
single worker and let Docker's DNS pick a replica per connection, which defeats
cache-aware routing (the router must know which replica holds which prefix). So each
`--worker-urls` URL whose host resolves to several IPv4 addresses becomes one URL per
address, then this process becomes vllm-router (exec), which receives the signals.
An address, or a name with one address, passes through unchanged.

Like nginx, it resolves once, at start: compose starts the router after every replica is
healthy (depends_on), and a replica that comes back with another address needs a router
restart.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

ROUTER = "vllm-router"
WORKER_FLAG = "--worker-urls"

Resolver = Callable[[str], list[str]]


def ipv4_addresses(host: str) -> list[str]:
    """Every IPv4 address of `host`."""
    infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def expand_url(url: str, resolve: Resolver) -> list[str]:
    """One URL per address of the URL's host (a literal address stays as it is)."""
    parts = urlsplit(url)
    host = parts.hostname
    if host is None:
        return [url]
    try:
        socket.inet_aton(host)
        return [url]
    except OSError:
        pass
    # A stable order: Docker's DNS rotates the records from one query to the next.
    addresses = sorted(set(resolve(host)), key=socket.inet_aton)
    if len(addresses) <= 1:
        return [url]
    port = f":{parts.port}" if parts.port else ""
    return [urlunsplit(parts._replace(netloc=f"{address}{port}")) for address in addresses]


def expand_worker_urls(argv: Sequence[str], resolve: Resolver = ipv4_addresses) -> list[str]:
    """The router's arguments with every --worker-urls value expanded (the values run up to
    the next flag)."""
    out: list[str] = []
    in_workers = False
    for arg in argv:
        if arg.startswith("-"):
            in_workers = arg == WORKER_FLAG
            out.append(arg)
        elif in_workers:
            out.extend(expand_url(arg, resolve))
        else:
            out.append(arg)
    return out


def main() -> None:
    argv = expand_worker_urls(sys.argv[1:])
    print(f"router-entrypoint: {ROUTER} {' '.join(argv)}", file=sys.stderr, flush=True)
    os.execvp(ROUTER, [ROUTER, *argv])


if __name__ == "__main__":
    main()
