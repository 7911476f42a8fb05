"""Paged KV-cache bookkeeping: ref-counted blocks, a free list, and prefix reuse.

A full block is known by a chained hash of (parent hash, its token ids): a 128-bit
blake2b digest, not Python's hash(), so that nobody can craft a prompt whose blocks
collide with another user's cached blocks and poison their output (vLLM moved to sha256
after CVE-2025-25183 for the same reason). When the
last owner frees it, it goes to the tail of the free list but keeps its hash, so a
later request with the same prefix can take it back; it is evicted only when the
free list hands it out again (lazy, least recently freed first).

When every layer of the model attends through a sliding window, a running sequence's
blocks that fell wholly out of the window go back to the pool early; their table entries
become FREED, so positions keep their block index. Such a block loses its hash at once:
the sequence that owned it no longer reads it, and the prefix cache must never hand out a
block whose contents may be overwritten before the next request reads it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from engine.core.sequence import Sequence
from engine.prefix_hashes import chain_hash

FREED = -1  # a block-table entry whose block fell out of the model's sliding window


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()

    def reset(self) -> None:
        self.ref_count = 1
        self.hash = None
        self.token_ids = ()


class BlockObserver(Protocol):
    """Told when the prefix cache changes (engine/observers/kv_events.py publishes it as KV events)."""

    def blocks_stored(self, seq: Sequence, indices: list[int]) -> None:
        """Blocks `indices` of seq's table just entered the prefix cache."""

    def block_removed(self, block_hash: int) -> None:
        """The block cached under `block_hash` left the prefix cache (evicted or forgotten)."""

    def all_cleared(self) -> None:
        """The prefix cache was emptied."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 window: int | None = None) -> None:
        self.block_size = block_size
        self.window = window  # every layer's sliding window (the widest), or None: blocks are kept
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.num_used = 0
        self.prefix_queries = 0  # tokens looked up in the prefix cache
        self.prefix_hits = 0  # tokens found there
        self.observer: BlockObserver | None = None

    # ---- queries -------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def num_cached_idle(self) -> int:
        return sum(1 for b in self.free_ids if self.blocks[b].hash is not None)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache --------------------------------------------------
    def hash_blocks(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        """Chained hashes of the first full blocks, memoized on the sequence."""
        bs = self.block_size
        while len(seq.block_hashes) < num_full_blocks:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if i else seq.cache_root
            seq.block_hashes.append(chain_hash(parent, tuple(seq.token_ids[i * bs:(i + 1) * bs])))
        return seq.block_hashes[:num_full_blocks]

    def cached_hashes(self) -> list[int]:
        """The hashes of the blocks the prefix cache holds, in use or idle, read from another
        thread (a fleet replica's routing report). The dict is copied in one C call, which the
        step thread cannot interleave with; if a copy still races a resize, the caller's next
        report will do."""
        for _ in range(3):
            try:
                return list(tuple(self.hash_to_block))
            except RuntimeError:
                continue
        return []

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks covering a prefix; the last token is always left to compute."""
        if not self.enable_prefix_caching or seq.skip_prefix_cache:
            return []
        hits: list[int] = []
        bs = self.block_size
        for i, h in enumerate(self.hash_blocks(seq, (len(seq) - 1) // bs)):
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tuple(seq.token_ids[i * bs:(i + 1) * bs]):
                break
            hits.append(block_id)
        return hits

    # ---- allocation ----------------------------------------------------
    def can_allocate(self, seq: Sequence, num_tokens: int, reserve_blocks: int = 0) -> bool:
        """Could `num_tokens` positions be given to seq and still leave `reserve_blocks` free?"""
        hits = self.match_prefix(seq)
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        needed = self.blocks_for(num_tokens) - len(hits) + revived
        return self.num_free - needed >= reserve_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Give seq blocks for its first `num_tokens` positions, reusing cached prefix blocks."""
        assert not seq.block_table, f"{seq.request_id} already holds blocks"
        hits = self.match_prefix(seq)
        for block_id in hits:
            self._take(block_id)
        seq.block_table = list(hits)
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        if self.enable_prefix_caching:
            self.prefix_queries += len(seq)
            self.prefix_hits += seq.num_cached_tokens
        self._grow(seq, self.blocks_for(num_tokens))

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return needed <= self.num_free

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        self._grow(seq, self.blocks_for(seq.num_computed_tokens + num_new_tokens))

    def free_outside_window(self, seq: Sequence, first_position: int) -> None:
        """Release the blocks no query from `first_position` on can see through the window.

        A query at p sees positions > p - window, so the blocks wholly below
        first_position - window + 1 are dead for this step and every later one.
        """
        if self.window is None:
            return
        dead = min(max(0, first_position - self.window + 1) // self.block_size, len(seq.block_table))
        for i in range(dead - 1, -1, -1):  # back to the first entry already released
            block_id = seq.block_table[i]
            if block_id == FREED:
                break
            seq.block_table[i] = FREED
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._forget(block)
                self.num_used -= 1
                self.free_ids[block_id] = None
                self.free_ids.move_to_end(block_id, last=False)  # holds nothing worth keeping: reuse first

    def free(self, seq: Sequence) -> None:
        # Tail blocks first, so a shared prefix is the last to be evicted.
        for block_id in reversed(seq.block_table):
            if block_id == FREED:
                continue
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.num_used -= 1
                self.free_ids[block_id] = None
        seq.block_table = []

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` positions (a rejected draft's) and
        forget hashes of blocks that are no longer full of settled tokens."""
        keep = self.blocks_for(num_tokens)
        for block_id in reversed(seq.block_table[keep:]):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.num_used -= 1
                self.free_ids[block_id] = None
                self.free_ids.move_to_end(block_id, last=False)  # no hash: reuse it first
        del seq.block_table[keep:]
        del seq.block_hashes[len(seq) // self.block_size:]

    def commit_full_blocks(self, seq: Sequence) -> None:
        """Publish newly computed full blocks to the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        stored: list[int] = []
        for i, h in enumerate(self.hash_blocks(seq, full)):
            if seq.block_table[i] == FREED:
                continue
            block = self.blocks[seq.block_table[i]]
            if block.hash is not None:
                continue
            if h not in self.hash_to_block:
                self.hash_to_block[h] = block.block_id
                block.hash = h
                block.token_ids = tuple(seq.token_ids[i * bs:(i + 1) * bs])
                stored.append(i)
        if stored and self.observer is not None:
            self.observer.blocks_stored(seq, stored)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block. Blocks that running requests hold stay theirs, and enter
        the cache again when their request next commits full blocks."""
        for block in self.blocks:
            block.hash = None
            block.token_ids = ()
        self.hash_to_block.clear()
        if self.observer is not None:
            self.observer.all_cleared()

    # ---- internals -----------------------------------------------------
    def _grow(self, seq: Sequence, num_blocks: int) -> None:
        while len(seq.block_table) < num_blocks:
            seq.block_table.append(self._take_free())

    def _take_free(self) -> int:
        block_id, _ = self.free_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
            self._uncache(block.hash)  # evicted now, not when it was freed
        block.reset()
        self.num_used += 1
        return block_id

    def _forget(self, block: Block) -> None:
        """Take a block out of the prefix cache."""
        if block.hash is not None and self.hash_to_block.get(block.hash) == block.block_id:
            self._uncache(block.hash)
        block.hash = None
        block.token_ids = ()

    def _uncache(self, block_hash: int) -> None:
        del self.hash_to_block[block_hash]
        if self.observer is not None:
            self.observer.block_removed(block_hash)

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_ids[block_id]
            self.num_used += 1
        block.ref_count += 1

    # ---- checking ------------------------------------------------------
    def check_invariants(self, seqs: list[Sequence]) -> None:
        """free + in use == total (cached-idle blocks are free); owners match ref counts."""
        owners: dict[int, int] = {}
        for seq in seqs:
            held = [b for b in seq.block_table if b != FREED]
            assert len(set(held)) == len(held), f"{seq.request_id} holds a block twice"
            assert FREED not in seq.block_table[len(seq.block_table) - len(held):], "a freed block after a held one"
            for b in held:
                owners[b] = owners.get(b, 0) + 1
        in_use = {b.block_id for b in self.blocks if b.ref_count > 0}
        assert self.num_used == len(in_use), (self.num_used, len(in_use))
        assert not in_use & set(self.free_ids), "a block is both free and in use"
        assert len(self.free_ids) + len(in_use) == self.num_blocks, "blocks leaked"
        for block in self.blocks:
            assert block.ref_count == owners.get(block.block_id, 0), f"block {block.block_id} ref count is wrong"
        for h, block_id in self.hash_to_block.items():
            assert self.blocks[block_id].hash == h, "hash map points at a block with another hash"
