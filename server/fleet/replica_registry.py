"""The replicas each router in this process sees, by deployment name; the ingress reads them
to send one request to every replica (/metrics).

It lives in a module of its own because Ray ships a request router's module by value
(cloudpickle): a dict defined there would be a copy in the ingress's process, while this
module is imported by reference and so is the same object for the router and the ingress."""

from __future__ import annotations

KNOWN_REPLICAS: dict[str, list[str]] = {}


def remember(deployment: str, replica_ids: list[str]) -> None:
    KNOWN_REPLICAS[deployment] = sorted(replica_ids)


def known(deployment: str) -> list[str]:
    return list(KNOWN_REPLICAS.get(deployment, []))
