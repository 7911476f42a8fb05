"""The parts of server/fleet/ that need no cluster: a prompt's routing keys are the engine's
own block hashes, and the merged /metrics page is valid Prometheus text with one series per
replica."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from engine.sampling_params import SamplingParams
from server.fleet.block_keys import KEY_MASK, cached_keys, prompt_keys
from server.fleet.replica_metrics import merge_metrics


def test_prompt_keys_are_the_block_managers_hashes_of_what_it_can_reuse() -> None:
    manager = BlockManager(num_blocks=16, block_size=16)
    tokens = list(range(1000, 1000 + 16 * 3 + 5))
    seq = Sequence("a", list(tokens), SamplingParams(), None)  # type: ignore[arg-type]
    manager.allocate(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    manager.commit_full_blocks(seq)
    assert prompt_keys(tokens, 16) == [h & KEY_MASK for h in seq.block_hashes[:3]]
    assert set(prompt_keys(tokens, 16)) <= set(cached_keys(manager.hash_to_block))
    # The last token is always computed, so a prompt of exactly three blocks has two reusable ones.
    assert len(prompt_keys(tokens[:48], 16)) == 2


def test_merged_metrics_label_each_replica_and_write_each_family_once() -> None:
    page = ("# HELP pagode:prefix_cache_hits_total Prompt tokens found.\n"
            "# TYPE pagode:prefix_cache_hits_total counter\n"
            'pagode:prefix_cache_hits_total{model_name="m"} %s\n')
    merged = merge_metrics({"r1": page % 3.0, "r2": page % 5.0}).decode()
    assert merged.count("# TYPE pagode:prefix_cache_hits") == 1
    families = list(text_string_to_metric_families(merged))
    samples = {s.labels["replica"]: s.value for f in families for s in f.samples}
    assert samples == {"r1": 3.0, "r2": 5.0}
