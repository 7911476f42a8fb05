"""Write tests/data/vllm_lora_block_hashes.json from vLLM's own functions: the block hashes and
KV-event fields of requests that run on a LoRA adapter.

Unlike scripts/vllm_block_hash_vectors.py (which cuts the functions out of a wheel), this
imports vLLM itself, so it runs in the venv of vLLM's CPU build that `make bench-vs-peers`
installs:

    .venv-vllm/bin/python scripts/vllm_lora_block_hash_vectors.py

A request's adapter enters each block's hash as an extra key (`_gen_lora_extra_hash_keys`,
through `generate_block_hash_extra_keys`), and its events carry the adapter's int id, its name
and one untagged extra key per block (`to_event_extra_keys`), as vLLM's block pool builds them.
tests/test_kv_events.py holds pagode's events to the file.
"""

from __future__ import annotations

import json
import random
import types
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm_lora_block_hashes.json"
BLOCK_SIZE = 16


def case(k: types.ModuleType, sha256_cbor: object, name: str, lora_id: int, path: str,
         tokens: list[int]) -> dict[str, object]:
    from vllm.lora.request import LoRARequest

    request = types.SimpleNamespace(lora_request=LoRARequest(name, lora_id, path), mm_features=[], cache_salt=None,
                                    prompt_embeds=None, all_token_ids=tokens, num_tokens=len(tokens))
    hashes, extra_keys, parent = [], [], None
    for start in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        keys, _ = k.generate_block_hash_extra_keys(request, start, start + BLOCK_SIZE, 0)
        parent = k.hash_block_tokens(sha256_cbor, parent, tokens[start:start + BLOCK_SIZE], keys)
        hashes.append(k.maybe_convert_block_hash(parent))
        extra_keys.append(keys)
    return {"lora_name": name, "lora_id": lora_id, "lora_path": path, "token_ids": tokens, "hashes": hashes,
            "event_extra_keys": [list(keys) for keys in k.to_event_extra_keys(extra_keys) or []]}


def main() -> None:
    import vllm
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils as k

    k.init_none_hash(sha256_cbor)  # PYTHONHASHSEED unset: vLLM's "vllm-none-hash" seed
    rng = random.Random(3)
    cases = [case(k, sha256_cbor, name, lora_id, path, [rng.randrange(49152) for _ in range(length)])
             for name, lora_id, path, length in (("sql", 1, "/adapters/sql", 48), ("chat", 2, "/adapters/chat", 40))]
    OUT.write_text(json.dumps({"generated_by": "python scripts/vllm_lora_block_hash_vectors.py (vLLM's own "
                                               "kv_cache_utils, PYTHONHASHSEED unset)",
                               "vllm_version": vllm.__version__, "algorithm": "sha256_cbor",
                               "block_size": BLOCK_SIZE, "cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    main()
