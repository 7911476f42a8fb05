"""A Ray Serve request router that sends each prompt to the replica whose prefix cache
already holds the most of its leading blocks.

Each replica reports the keys of the KV blocks its cache holds (`record_routing_stats`, every
`request_routing_stats_period_s`); between reports the router also remembers where it sent
each prompt's blocks, since those will be cached there as soon as the prompt is prefilled.
A prompt goes to the replica that holds the longest run of its leading blocks; a prompt that
no replica holds goes to the replica sent the fewest distinct prefixes lately, so that distinct
prefixes spread over the replicas instead of piling onto one. When the replicas' queues differ by more
than `imbalanced_threshold` requests, load wins: the least loaded replica takes it.

The chosen replica is the only rank offered until it is known to be full or the request has
waited `spill_after_s`: Ray falls through to a later rank whenever a replica misses its
queue-length probe's deadline (0.1 s at first), which a replica busy prefilling on a loaded
machine does, and a spill to a replica without the prefix costs a full prefill there.

Unlike Ray's PrefixCacheAffinityRouter (a character tree of the prompts it routed), this
reads what the engines really hold, so an evicted prefix stops attracting its prompts.

`policy="random"` routes uniformly at random instead: the baseline the tests compare with."""

from __future__ import annotations

import random
import time
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from server.fleet import replica_registry
from server.fleet.relay import RelayRequest

POLICIES = ("prefix", "random")


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, policy: str = "prefix", imbalanced_threshold: int = 8,
                         remembered_s: float = 30.0, spill_after_s: float = 3.0, seed: int | None = None,
                         **_: Any) -> None:
        """Set from RequestRouterConfig.request_router_kwargs. `remembered_s`: how long a
        routing choice counts as cached there without a replica's report confirming it;
        `spill_after_s`: how long a request waits for its prefix's replica to answer before
        another may take it."""
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
        self.policy = policy
        self.imbalanced_threshold = imbalanced_threshold
        self.remembered_s = remembered_s
        self.spill_after_s = spill_after_s
        self.rng = random.Random(seed)
        self.sent: dict[ReplicaID, dict[int, float]] = {}  # replica -> key -> when sent
        self.heads: dict[ReplicaID, dict[int, float]] = {}  # replica -> first key -> when sent

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        alive = {r.replica_id for r in replicas}
        for gone in set(getattr(self, "sent", {})) - alive:
            del self.sent[gone]
        for gone in set(getattr(self, "heads", {})) - alive:
            del self.heads[gone]
        # Through the module: Ray ships this one by value, so its own globals are copies.
        replica_registry.remember(self._deployment_id.name, [r.replica_id.unique_id for r in replicas])

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """Ranks, best first; Ray takes the least loaded replica of the first rank that has
        room, so the later ranks are where a full replica's requests spill over."""
        request = relay_request(pending_request)
        if request is not None and request.replica is not None:
            return [[r for r in candidate_replicas if r.replica_id.unique_id == request.replica]]
        if not candidate_replicas:
            return []
        if (request.policy if request is not None and request.policy else self.policy) == "random":
            return [[self.rng.choice(candidate_replicas)]]
        keys = request.block_keys if request is not None else []
        if not keys or self.imbalanced(candidate_replicas):
            return [candidate_replicas]
        best = self.rank_by_prefix(candidate_replicas, keys)
        rest = [r for r in candidate_replicas if r not in best]
        if rest and (self.full(best[0]) or waited_s(pending_request) > self.spill_after_s):
            return [best, rest]
        return [best]

    def rank_by_prefix(self, candidates: list[RunningReplica], keys: list[int]) -> list[RunningReplica]:
        """The replica holding the longest run of the prompt's leading blocks, or, when none
        holds its first block, the one sent the fewest distinct prefixes lately (ties broken at
        random)."""
        now = time.monotonic()
        held = {r.replica_id: self.held_keys(r, now) for r in candidates}
        matched = {r.replica_id: leading_run(keys, held[r.replica_id]) for r in candidates}
        most = max(matched.values())
        if most > 0:
            best = [r for r in candidates if matched[r.replica_id] == most]
        else:
            # Not what the caches hold (once warm, every cache is full of idle blocks), but
            # what was sent lately: the replica serving the fewest live prefixes. Prefixes, not
            # blocks: one long prompt's blocks would outweigh several short prefixes.
            recent = {r.replica_id: self.live_heads(r.replica_id, now) for r in candidates}
            fewest = min(recent.values())
            best = [r for r in candidates if recent[r.replica_id] == fewest]
        return [self.rng.choice(best)]

    def held_keys(self, replica: RunningReplica, now: float) -> set[int]:
        """What the replica last reported, and what was sent there since that may not yet
        be in a report."""
        reported = (replica.routing_stats or {}).get("block_keys") or ()
        sent = self.sent.get(replica.replica_id, {})
        for key in [k for k, when in sent.items() if now - when > self.remembered_s]:
            del sent[key]
        return set(reported) | sent.keys()

    def live_heads(self, replica_id: ReplicaID, now: float) -> int:
        heads = self.heads.get(replica_id, {})
        for key in [k for k, when in heads.items() if now - when > self.remembered_s]:
            del heads[key]
        return len(heads)

    def imbalanced(self, candidates: list[RunningReplica]) -> bool:
        lengths = [self._replica_queue_len_cache.get(r.replica_id) for r in candidates]
        known = [n for n in lengths if n is not None]
        return len(known) > 1 and max(known) - min(known) > self.imbalanced_threshold

    def full(self, replica: RunningReplica) -> bool:
        """Whether the replica's last known queue holds as many requests as it takes."""
        length = self._replica_queue_len_cache.get(replica.replica_id)
        return length is not None and length >= replica.max_ongoing_requests

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        request = relay_request(pending_request)
        if request is None or not request.block_keys:
            return
        now = time.monotonic()
        sent = self.sent.setdefault(replica_id, {})
        for key in request.block_keys:
            sent[key] = now
        self.heads.setdefault(replica_id, {})[request.block_keys[0]] = now


def relay_request(pending_request: PendingRequest | None) -> RelayRequest | None:
    if pending_request is None or not pending_request.args:
        return None
    first = pending_request.args[0]
    return first if isinstance(first, RelayRequest) else None


def waited_s(pending_request: PendingRequest | None) -> float:
    """Seconds since the request was handed to the router (Ray stamps it with time.time())."""
    return time.time() - pending_request.created_at if pending_request is not None else 0.0


def leading_run(keys: list[int], held: set[int]) -> int:
    """How many of the prompt's first blocks are held, up to the first that is not (the
    engine reuses a cached prefix only up to its first miss)."""
    run = 0
    for key in keys:
        if key not in held:
            break
        run += 1
    return run
