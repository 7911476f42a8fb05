"""Shared fixtures: the real default model, and transformers' reference on the same weights."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests_support import cache_sharing_builds

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest_plugins = [p for p in ("server_fixtures", "proxy_support")
                  if os.path.exists(os.path.join(os.path.dirname(__file__), f"{p}.py"))]

PRIVATE_CACHE = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Point PAGODE_CACHE_DIR, for this process and every server it starts, at a cache of the
    test run's own."""
    from engine import envs

    private = cache_sharing_builds(Path(tempfile.mkdtemp(prefix="pagode-test-cache-")),
                                   envs.CACHE_DIR.get())
    config.stash[PRIVATE_CACHE] = private
    os.environ["PAGODE_CACHE_DIR"] = str(private)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built (torch, transformers, every test module and item) out of
    the collector: it lives as long as the session, and each full collection walked it again
    (test_decode_step_families: 21 passes, 2.2 s of its 25 s; 1.5 s with the freeze). What the
    tests build later, models and engines included, is still collected."""
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    private = config.stash.get(PRIVATE_CACHE, None)
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)


def allowed_isa_caps() -> list[str]:
    """The PAGODE_CPU_ISA values this machine can run: its own level and each one below it,
    from avx2 (on a CPU below AVX2 the cap changes nothing: the baseline build runs)."""
    from cpu_kernels.isa import Level, detect

    own = detect().level
    return [lvl.label for lvl in (Level.AVX2, Level.AVX512, Level.AMX) if lvl <= own] or ["avx2"]


@pytest.fixture(params=allowed_isa_caps())
def isa_cap(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once per ISA cap this machine allows, so that an AVX-512 or AMX machine
    also runs the lower levels' kernels (each cap builds and loads its own library)."""
    monkeypatch.setenv("PAGODE_CPU_ISA", request.param)
    return str(request.param)


@pytest.fixture(scope="session")
def default_model_path() -> str:
    from engine.model.loader import default_model_path as find

    return str(find())


@pytest.fixture(scope="session")
def hf_reference(default_model_path: str) -> Iterator[torch.nn.Module]:
    """transformers' LlamaForCausalLM, dequantized from the same GGUF file."""
    from reference import gguf_parsed_once
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(default_model_path)
    with gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    yield model


@pytest.fixture(scope="session")
def small_llm():  # type: ignore[no-untyped-def]
    """One small engine for the tests that need a tight cache (preemption), priorities or a
    small token budget: 11 KV blocks of 16, scheduling policy "priority" (all-zero
    priorities behave as fcfs). Tests change max_num_seqs / the token budget through
    `overrides` and put them back."""
    from engine import LLM

    # fp32 KV: 11 blocks, and prompt logprobs compared with transformers to 1e-4.
    return LLM(kv_cache_memory="8MiB", max_model_len=128, scheduling_policy="priority",
               kv_cache_dtype="fp32", quantization="none")


@pytest.fixture(scope="session")
def default_llm():  # type: ignore[no-untyped-def]
    """One engine with the shipped defaults (auto weights, fp16 KV), 128 MiB of KV cache and a
    1024-token context, for the engine-level tests that ask only for the default model: a
    model load is seconds of a start, and these tests leave no request behind."""
    from engine import LLM

    return LLM(kv_cache_memory="128MiB", max_model_len=1024, quantization="none")


@pytest.fixture
def overrides(small_llm):  # type: ignore[no-untyped-def]
    config = small_llm.engine.config
    saved = dict(vars(config))

    def apply(**fields: object) -> None:
        for name, value in fields.items():
            setattr(config, name, value)

    yield apply
    vars(config).update(saved)


@pytest.fixture(scope="session")
def tiny_zoo(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Tiny random checkpoints of any family (tests/tiny_models.py), built once per session."""
    from tiny_models import TinyZoo

    return TinyZoo(tmp_path_factory.mktemp("tiny-zoo"))
