"""vLLM's block hashes, for the KV events that fleet routers read.

pagode's own prefix cache keys blocks by a blake2b chain (block_manager.chain_hash). What it
publishes must be vLLM's key instead, so that an indexer that tokenizes the prompt itself, or
that mixes pagode and vLLM replicas, finds the same blocks. That is vLLM's `sha256_cbor`
(`vllm/utils/hashing.py`, `vllm/v1/core/kv_cache_utils.py`):

    H(x) = SHA-256(cbor2.dumps(x, canonical=True))
    NONE_HASH = H(seed)       seed: $PYTHONHASHSEED if set, else "vllm-none-hash"
    block_i   = H((block_{i-1} or NONE_HASH, tuple(token_ids_i), extra_keys))

over full blocks only. extra_keys is None on the base model (no multimodal input, cache salt
or prompt embeddings here); a block of a request on a LoRA adapter has vLLM's
`(("lora", name, path),)` (`_gen_lora_extra_hash_keys`), so its hashes are the ones a vLLM
serving the same adapter publishes, and never a base block's. The parent is chained as the
whole 32-byte digest; the events carry each digest's last 8 bytes as a big-endian integer
(vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, its default).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import cbor2

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # vLLM's seed for cryptographic hashes
HASH_ALGORITHM = "sha256_cbor"
INT_MASK = (1 << 64) - 1


def sha256_cbor(value: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def none_hash_seed() -> str:
    """The seed NONE_HASH comes from: PYTHONHASHSEED wins, as in vLLM's resolve_none_hash_seed."""
    return os.environ.get("PYTHONHASHSEED", DEFAULT_NONE_HASH_SEED)


def none_hash(seed: str | None = None) -> bytes:
    return sha256_cbor(none_hash_seed() if seed is None else seed)


def hash_block(parent: bytes | None, token_ids: Sequence[int], root: bytes,
               extra_keys: tuple[Any, ...] | None = None) -> bytes:
    """One block's digest, chained from its parent's digest (None: the first block)."""
    return sha256_cbor((parent or root, tuple(token_ids), extra_keys))


def lora_extra_keys(name: str, path: str) -> tuple[Any, ...]:
    """The extra keys of every block of a request on the adapter `name` loaded from `path`."""
    return (("lora", name, path),)


def hash_blocks(token_ids: Sequence[int], block_size: int, seed: str | None = None) -> list[bytes]:
    """The digests of every full block of a token sequence (what an external indexer computes)."""
    root = none_hash(seed)
    digests: list[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        digests.append(hash_block(digests[-1] if digests else None, token_ids[start:start + block_size], root))
    return digests


def external_hash(digest: bytes) -> int:
    """The integer a KV event carries: the digest's last 8 bytes, big-endian."""
    return int.from_bytes(digest, "big") & INT_MASK
