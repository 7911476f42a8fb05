"""The parts of server/fleet/ that need no cluster: a prompt's routing keys are the engine's
own block hashes, the prefix router offers only its prefix's replica until that one is full
or the request has waited, the merged /metrics page is valid Prometheus text with one series
per replica, and the ingress answers a replica lost mid-answer with an error, never an empty 200."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from engine.sampling_params import SamplingParams
from server.fleet.block_keys import KEY_MASK, cached_keys, prompt_keys
from server.fleet.relay import RelayRequest
from server.fleet.replica_metrics import merge_metrics

ray_router = pytest.importorskip("server.fleet.prefix_router")


def test_prompt_keys_are_the_block_managers_hashes_of_what_it_can_reuse() -> None:
    manager = BlockManager(num_blocks=16, block_size=16)
    tokens = list(range(1000, 1000 + 16 * 3 + 5))
    seq = Sequence("a", list(tokens), SamplingParams(), None)  # type: ignore[arg-type]
    manager.allocate(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    manager.commit_full_blocks(seq)
    assert prompt_keys(tokens, 16) == [h & KEY_MASK for h in seq.block_hashes[:3]]
    assert set(prompt_keys(tokens, 16)) <= set(cached_keys(manager.cached_hashes()))
    # The last token is always computed, so a prompt of exactly three blocks has two reusable ones.
    assert len(prompt_keys(tokens[:48], 16)) == 2


async def test_the_prefix_router_offers_its_replica_alone_until_it_is_full_or_the_request_waited() -> None:
    """Ray falls through to the next rank whenever a replica misses a queue-length probe's
    deadline (a busy replica on a loaded machine): offering the rest too would send a prompt
    away from its cached prefix. They are offered once the replica is full or the request
    has waited spill_after_s."""
    router = ray_router.PrefixAffinityRouter.__new__(ray_router.PrefixAffinityRouter)
    router.initialize_state(spill_after_s=3.0, seed=0)
    holder, other = (SimpleNamespace(replica_id=name, max_ongoing_requests=8, routing_stats={"block_keys": keys})
                     for name, keys in (("holder", [11, 12, 13]), ("other", [21])))
    queues: dict[str, int] = {}
    router._replica_queue_len_cache = SimpleNamespace(get=queues.get)

    def pending(age_s: float) -> SimpleNamespace:
        return SimpleNamespace(args=[RelayRequest("POST", "/v1/chat/completions", block_keys=[11, 12, 99])],
                               created_at=time.time() - age_s)

    assert await router.choose_replicas([other, holder], pending(0.0)) == [[holder]]
    queues.update(holder=3, other=0)
    assert await router.choose_replicas([other, holder], pending(0.0)) == [[holder]]
    assert await router.choose_replicas([other, holder], pending(3.5)) == [[holder], [other]]
    queues["holder"] = 8
    assert await router.choose_replicas([other, holder], pending(0.0)) == [[holder], [other]]


def test_merged_metrics_label_each_replica_and_write_each_family_once() -> None:
    page = ("# HELP pagode:prefix_cache_hits_total Prompt tokens found.\n"
            "# TYPE pagode:prefix_cache_hits_total counter\n"
            'pagode:prefix_cache_hits_total{model_name="m"} %s\n')
    merged = merge_metrics({"r1": page % 3.0, "r2": page % 5.0}).decode()
    assert merged.count("# TYPE pagode:prefix_cache_hits") == 1
    families = list(text_string_to_metric_families(merged))
    samples = {s.labels["replica"]: s.value for f in families for s in f.samples}
    assert samples == {"r1": 3.0, "r2": 5.0}


class LostReplicaStream:
    """A replica's answer that stops after `parts`: its actor died there."""

    def __init__(self, parts: list[object]) -> None:
        self.parts, self.cancelled = list(parts), False

    def __aiter__(self) -> LostReplicaStream:
        return self

    async def __anext__(self) -> object:
        if not self.parts:
            raise RuntimeError("ActorDiedError: the replica's actor died")
        return self.parts.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


class OneStreamHandle:
    """What the ingress calls on its replicas' handle: options(stream=True).serve.remote(request)."""

    def __init__(self, stream: LostReplicaStream) -> None:
        self.stream = stream
        self.serve = self

    def options(self, **_: object) -> OneStreamHandle:
        return self

    def remote(self, _: object) -> LostReplicaStream:
        return self.stream


@pytest.mark.parametrize("parts", [[], [b'{"id": "cmpl-1", ']], ids=["after-the-head", "mid-body"])
async def test_a_replica_lost_after_a_json_heads_status_gives_a_503_not_an_empty_200(parts: list[bytes]) -> None:
    """A whole (non-SSE) body is relayed only once it is all there: a replica that dies
    between its head and the end of its body is an OpenAI-shaped 503 for the client."""
    from types import SimpleNamespace

    from server.fleet.ray_app import PagodeIngress
    from server.fleet.relay import RelayRequest, ResponseHead

    head = ResponseHead(200, [(b"content-type", b"application/json")])
    stream = LostReplicaStream([head, *parts])
    ingress = SimpleNamespace(replicas=OneStreamHandle(stream))
    response = await PagodeIngress.func_or_class.respond(ingress, RelayRequest("POST", "/v1/chat/completions"))
    assert response.status_code == 503
    assert json.loads(bytes(response.body))["error"]["message"].startswith("the replica serving this request failed")
    assert stream.cancelled
