"""vLLM's block hash, transcribed as the tests' reference for prompts only a server sees.

No vLLM install is at hand to import (its package needs its GPU stack), so this transcribes
from vllm-project/vllm (0.34.0), `vllm/utils/hashing.py` (sha256_cbor) and
`vllm/v1/core/kv_cache_utils.py` (resolve_none_hash_seed, init_none_hash, hash_block_tokens,
maybe_convert_block_hash), kept as close to the original text as a standalone module allows.
engine/core/block_hashes.py is written separately. tests/test_kv_events.py holds both to
tests/data/vllm_block_hashes.json, which vLLM's own source computed
(scripts/vllm_block_hash_vectors.py).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import cbor2

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
NONE_HASH: bytes = b""


def sha256_cbor(input: Any) -> bytes:  # noqa: A002 - vLLM's parameter name
    input_bytes = cbor2.dumps(input, canonical=True)
    return hashlib.sha256(input_bytes).digest()


def resolve_none_hash_seed(hash_fn: Callable[[Any], bytes]) -> str:
    hash_seed = os.getenv("PYTHONHASHSEED")
    if hash_seed is not None:
        return hash_seed
    return DEFAULT_NONE_HASH_SEED  # (xxhash variants draw a random seed; sha256_cbor does not)


def init_none_hash(hash_fn: Callable[[Any], bytes]) -> None:
    global NONE_HASH
    NONE_HASH = hash_fn(resolve_none_hash_seed(hash_fn))


def hash_block_tokens(hash_function: Callable[[Any], bytes], parent_block_hash: bytes | None,
                      curr_block_token_ids: Sequence[int], extra_keys: tuple[Any, ...] | None = None) -> bytes:
    if not parent_block_hash:
        parent_block_hash = NONE_HASH
    curr_block_token_ids_tuple = tuple(curr_block_token_ids)
    return hash_function((parent_block_hash, curr_block_token_ids_tuple, extra_keys))


def maybe_convert_block_hash(hash_bytes: bytes) -> int:
    return int.from_bytes(hash_bytes, byteorder="big") & ((1 << 64) - 1)


def request_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """What a vLLM engine with --prefix-caching-hash-algo sha256_cbor publishes for a prompt's
    full blocks (get_request_block_hasher, then maybe_convert_block_hash)."""
    init_none_hash(sha256_cbor)
    hashes: list[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block_tokens(sha256_cbor, parent, token_ids[start:start + block_size]))
    return [maybe_convert_block_hash(h) for h in hashes]
