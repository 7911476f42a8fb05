"""Write tests/data/vllm_block_hashes.json from vLLM's own block-hash functions.

vLLM's package cannot be imported without its GPU stack, so this runs the functions' own source
text: `vllm/utils/hashing.py` is loaded as it is (it needs cbor2 only), and `init_none_hash`,
`resolve_none_hash_seed`, `hash_block_tokens` and `maybe_convert_block_hash` are cut out of
`vllm/v1/core/kv_cache_utils.py` and run with vLLM's module globals they read (the seed
constants; `envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` at its default, True).

    pip download vllm --no-deps -d /tmp/vllm && python scripts/vllm_block_hash_vectors.py /tmp/vllm/vllm-*.whl

tests/test_kv_events.py holds engine/core/block_hashes.py to the file it writes.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import logging
import os
import random
import sys
import types
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm_block_hashes.json"
BLOCK_SIZE = 16
WANTED = {"maybe_convert_block_hash", "DEFAULT_NONE_HASH_SEED", "_NON_CRYPTO_HASH_FUNCTIONS", "_NONE_HASH_SEED",
          "resolve_none_hash_seed", "init_none_hash", "hash_block_tokens"}


def read_sources(wheel: Path) -> tuple[str, str, str]:
    with zipfile.ZipFile(wheel) as archive:
        version = next(name.split("/")[0].removesuffix(".dist-info").split("-")[1] for name in archive.namelist()
                       if name.endswith(".dist-info/METADATA"))
        return (version, archive.read("vllm/utils/hashing.py").decode(),
                archive.read("vllm/v1/core/kv_cache_utils.py").decode())


def vllm_functions(hashing_source: str, utils_source: str) -> dict[str, Any]:
    """vLLM's hashing module, and the wanted top-level statements of kv_cache_utils run in a
    namespace that supplies the names they read."""
    spec = importlib.util.spec_from_loader("vllm_hashing", loader=None)
    assert spec is not None
    hashing = importlib.util.module_from_spec(spec)
    exec(compile(hashing_source, "vllm/utils/hashing.py", "exec"), hashing.__dict__)  # noqa: S102
    tree = ast.parse(utils_source)
    kept = [node for node in tree.body if _name(node) in WANTED]
    assert {_name(node) for node in kept} == WANTED, {_name(node) for node in kept}
    namespace: dict[str, Any] = {
        "os": os, "Any": Any, "Callable": Callable, "Sequence": Sequence, "BlockHash": bytes,
        "ExternalBlockHash": bytes | int, "xxhash": hashing.xxhash, "xxhash_cbor": hashing.xxhash_cbor,
        "envs": types.SimpleNamespace(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=True),
        "logger": logging.getLogger("vllm"),
    }
    exec(compile(ast.Module(body=kept, type_ignores=[]), "vllm/v1/core/kv_cache_utils.py", "exec"), namespace)  # noqa: S102
    namespace["sha256_cbor"] = hashing.sha256_cbor
    return namespace


def _name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.FunctionDef):
        return node.name
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id
    return None


def block_hashes(vllm: dict[str, Any], token_ids: list[int]) -> list[int]:
    """What vLLM publishes for a request's full blocks (get_request_block_hasher's loop)."""
    vllm["init_none_hash"](vllm["sha256_cbor"])
    hashes: list[bytes] = []
    for start in range(0, len(token_ids) - BLOCK_SIZE + 1, BLOCK_SIZE):
        parent = hashes[-1] if hashes else None
        hashes.append(vllm["hash_block_tokens"](vllm["sha256_cbor"], parent, token_ids[start:start + BLOCK_SIZE]))
    return [vllm["maybe_convert_block_hash"](h) for h in hashes]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="a vllm wheel (pip download vllm --no-deps)")
    args = parser.parse_args()
    version, hashing_source, utils_source = read_sources(args.wheel)
    vllm = vllm_functions(hashing_source, utils_source)
    rng = random.Random(30)
    cases = []
    for seed in (None, "0", "12345"):
        if seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = seed
        for length in (15, 16, 40, 100, 257):
            tokens = [rng.randrange(200_000) for _ in range(length)]
            cases.append({"pythonhashseed": seed, "token_ids": tokens, "hashes": block_hashes(vllm, tokens)})
    header = {"generated_by": "python scripts/vllm_block_hash_vectors.py VLLM_WHEEL: vLLM's own hashing.py and "
                              "kv_cache_utils.py functions, run on random token ids",
              "vllm_version": version, "algorithm": "sha256_cbor", "block_size": BLOCK_SIZE}
    lines = [json.dumps(header)[:-1] + ', "cases": [']
    lines += [" " + json.dumps(case) + ("," if i < len(cases) - 1 else "") for i, case in enumerate(cases)]
    OUT.write_text("\n".join(lines) + "\n]}\n")
    print(f"{len(cases)} cases from vLLM {version} -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
