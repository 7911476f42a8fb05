"""vLLM's KV-cache events, recorded from the block manager's prefix cache.

The block manager calls a KVEventRecorder (its BlockObserver) when full blocks enter the
prefix cache, when one leaves it, and when the cache is reset; the recorder turns those into
vLLM's events (vllm/distributed/kv_events.py), with vLLM's block hashes
(engine/core/block_hashes.py), and the engine hands each step's events to the publisher as
one batch:

- BlockStored: a run of consecutive blocks of one request, with their hashes, the hash of the
  block before the run (None for a prompt's first block), the token ids of all of them,
  block_size, medium ("CPU", or "GPU" on CUDA), and the request's LoRA adapter as vLLM's
  block pool gives it: lora_id (its int id, a fresh one per load as vLLM's lora_int_id is),
  lora_name, and in the map layout extra_keys, the untagged `[name]` of each block (None on
  the base model); an adapter's blocks hash with the adapter as an extra key, as vLLM's do;
- BlockRemoved: one evicted block's hash, as vLLM sends one per eviction;
- AllBlocksCleared: the prefix cache was reset.

Two wire layouts:
- "array" (the default): msgspec's array_like structs tagged by the class name, the layout
  llm-d's decoder reads: `["BlockStored", hashes, parent, token_ids, block_size, lora_id,
  medium, lora_name]`, `["BlockRemoved", hashes, medium]`, `["AllBlocksCleared"]`; exactly
  as many elements as llm-d's structs have fields (see event_types);
- "map": named fields with the tag under "type", as newer vLLM sends (vLLM's later fields
  are there too, left out at their defaults, as its omit_defaults does).
Either way a batch is the array `[ts, [events], data_parallel_rank]`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from engine.core.block_hashes import external_hash, hash_block, lora_extra_keys, none_hash
from engine.core.sequence import Sequence

DATA_PARALLEL_RANK = 0  # one engine per server


def event_types(layout: str) -> dict[str, type[msgspec.Struct]]:
    """vLLM's event classes in one wire layout, by their tag (the class name).

    The array layout stops at the fields llm-d's structs have: its msgpack library reads an
    array into a struct only when both have the same number of fields, so vLLM's later
    fields (extra_keys, group_idx, ...), which msgspec would write as nulls, would make every
    event unreadable there. The map layout has them all, left out at their defaults."""
    array = layout == "array"
    later_stored = [] if array else [
        ("extra_keys", "list[Any] | None", None), ("group_idx", "int | None", None),
        ("kv_cache_spec_kind", "str | None", None), ("kv_cache_spec_sliding_window", "int | None", None)]
    later_removed = [] if array else [("group_idx", "int | None", None)]
    base = msgspec.defstruct("KVCacheEvent", [], array_like=array, omit_defaults=True, gc=False, tag=True)
    stored = msgspec.defstruct("BlockStored", [
        ("block_hashes", list[int]), ("parent_block_hash", "int | None"), ("token_ids", list[int]),
        ("block_size", int), ("lora_id", "int | None"), ("medium", "str | None"), ("lora_name", "str | None"),
        *later_stored], bases=(base,))
    removed = msgspec.defstruct("BlockRemoved", [
        ("block_hashes", list[int]), ("medium", "str | None"), *later_removed], bases=(base,))
    cleared = msgspec.defstruct("AllBlocksCleared", [], bases=(base,))
    return {"BlockStored": stored, "BlockRemoved": removed, "AllBlocksCleared": cleared}


LAYOUTS = {layout: event_types(layout) for layout in ("array", "map")}


def encode_batch(ts: float, events: list[Any], encoder: msgspec.msgpack.Encoder | None = None) -> bytes:
    """A KVEventBatch as vLLM's msgspec encodes it: `[ts, [events], data_parallel_rank]`."""
    return (encoder or msgspec.msgpack.Encoder()).encode([ts, events, DATA_PARALLEL_RANK])


def consecutive_runs(indices: list[int]) -> Iterator[list[int]]:
    """[0, 1, 2, 5, 6] -> [0, 1, 2], [5, 6]: each run is one BlockStored with one parent."""
    run: list[int] = []
    for i in indices:
        if run and i != run[-1] + 1:
            yield run
            run = []
        run.append(i)
    if run:
        yield run


class KVEventRecorder:
    """The block manager's observer: keeps the vLLM digest of each block in the prefix cache
    (keyed by pagode's own hash of the same prefix) and the events of the current step."""

    def __init__(self, block_size: int, medium: str, layout: str = "array", seed: str | None = None,
                 lora_paths: Callable[[], dict[str, str]] = dict) -> None:
        """`lora_paths`: the loaded adapters' folders by name (an adapter's blocks hash with its
        path, as vLLM's do, so one name loaded from another folder never matches them)."""
        self.block_size = block_size
        self.medium = medium
        self.types = LAYOUTS[layout]
        self.lora_paths = lora_paths
        self.per_block_keys = "extra_keys" in self.types["BlockStored"].__struct_fields__
        self.root = none_hash(seed)
        self.digests: dict[int, bytes] = {}
        self.pending: list[Any] = []

    # ---- BlockObserver ---------------------------------------------------
    def blocks_stored(self, seq: Sequence, indices: list[int]) -> None:
        bs = self.block_size
        extra = self._extra_keys(seq)
        for run in consecutive_runs(indices):
            parent = self._digest(seq, run[0] - 1, extra) if run[0] else None
            digests, previous = [], parent
            for i in run:
                previous = hash_block(previous, seq.token_ids[i * bs:(i + 1) * bs], self.root, extra)
                self.digests[seq.block_hashes[i]] = previous
                digests.append(previous)
            adapter: dict[str, Any] = {"lora_id": seq.cache_root if seq.lora_name else None, "lora_name": seq.lora_name}
            if self.per_block_keys and seq.lora_name is not None:
                adapter["extra_keys"] = [[seq.lora_name]] * len(run)
            self.pending.append(self.types["BlockStored"](
                block_hashes=[external_hash(d) for d in digests],
                parent_block_hash=None if parent is None else external_hash(parent),
                token_ids=list(seq.token_ids[run[0] * bs:(run[-1] + 1) * bs]), block_size=bs,
                medium=self.medium, **adapter))

    def block_removed(self, block_hash: int) -> None:
        digest = self.digests.pop(block_hash, None)
        if digest is not None:
            self.pending.append(self.types["BlockRemoved"](block_hashes=[external_hash(digest)], medium=self.medium))

    def all_cleared(self) -> None:
        self.digests.clear()
        self.pending.append(self.types["AllBlocksCleared"]())

    # ---- the engine's side -------------------------------------------------
    def take_events(self) -> list[Any]:
        events, self.pending = self.pending, []
        return events

    def _extra_keys(self, seq: Sequence) -> tuple[Any, ...] | None:
        """vLLM's extra keys of the request's blocks: its adapter's, or None on the base. A
        request runs only while its adapter is loaded, so the adapter's path is there."""
        if seq.lora_name is None:
            return None
        return lora_extra_keys(seq.lora_name, self.lora_paths()[seq.lora_name])

    def _digest(self, seq: Sequence, i: int, extra: tuple[Any, ...] | None) -> bytes:
        """Block i's digest: remembered while it is cached, else chained again from the nearest
        remembered ancestor (a parent that a sliding window or an eviction took out)."""
        start = i
        while start >= 0 and seq.block_hashes[start] not in self.digests:
            start -= 1
        digest = self.digests[seq.block_hashes[start]] if start >= 0 else None
        bs = self.block_size
        for k in range(start + 1, i + 1):
            digest = hash_block(digest, seq.token_ids[k * bs:(k + 1) * bs], self.root, extra)
        assert digest is not None
        return digest
