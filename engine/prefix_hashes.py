"""The keys of the engine's prefix cache, public for whoever predicts what it holds.

The block manager knows a full block by a chained hash of (parent hash, its token ids): a
128-bit blake2b digest, not Python's hash(), so that nobody can craft a prompt whose blocks
collide with another user's cached blocks. A router in front of several engines (the fleet's
ingress) computes the same chain for a prompt here and compares it with the hashes each
engine reports holding (EngineClient.cached_block_hashes), without reaching into the block
manager.
"""

from __future__ import annotations

import hashlib
from array import array


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(b"root" if parent is None else parent.to_bytes(16, "little"))
    digest.update(array("q", token_ids).tobytes())
    return int.from_bytes(digest.digest(), "little")


def prompt_block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """The hashes of the prompt's full blocks that the engine could find cached, for a request
    whose chain starts at the root (no adapter, no cache salt): all but the last token, as
    BlockManager.match_prefix leaves that one to compute."""
    hashes: list[int] = []
    parent: int | None = None
    for start in range(0, (len(token_ids) - 1) // block_size * block_size, block_size):
        parent = chain_hash(parent, tuple(token_ids[start:start + block_size]))
        hashes.append(parent)
    return hashes
