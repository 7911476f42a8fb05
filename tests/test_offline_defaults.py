"""The offline LLM(...) and `pagode serve` build the same EngineConfig from the same model and
settings: one set of defaults, as vLLM's LLM and `vllm serve` share EngineArgs. Only the
config is compared: the engine that would load it is replaced by a recorder."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine import llm as llm_module
from engine.arg_utils import engine_config
from engine.config import EngineConfig
from engine.llm import LLM
from engine.request_limits import RequestCaps
from server.cli import build_parser

# The same settings as LLM keywords and as `pagode serve` flags.
CASES = [
    ({}, []),
    ({"max_model_len": 256, "kv_cache_dtype": "int8", "max_num_seqs": 8, "quantization": "none"},
     ["--max-model-len", "256", "--kv-cache-dtype", "int8", "--max-num-seqs", "8", "--quantization", "none"]),
    ({"enable_prefix_caching": False, "batching": "continuous", "max_n": 4, "lora_modules": {"a": "/adapters/a"}},
     ["--no-enable-prefix-caching", "--batching", "continuous", "--max-n", "4", "--lora-modules", "a=/adapters/a"]),
]


def offline(monkeypatch: pytest.MonkeyPatch, model: str, settings: dict[str, object]) -> EngineConfig:
    built: list[EngineConfig] = []
    monkeypatch.setattr(llm_module, "LLMEngine", lambda config: built.append(config) or SimpleNamespace(tokenizer=None))
    settings = dict(settings)
    if "max_n" in settings:  # a request cap: a flag of its own, a RequestCaps field to LLM
        settings["request_caps"] = RequestCaps(max_n=settings.pop("max_n"))  # type: ignore[arg-type]
    LLM(model, **settings)
    return built[0]


def served(model: str, flags: list[str]) -> EngineConfig:
    """What `pagode serve MODEL FLAGS` builds before it sizes the batch (server/cli.py's serve)."""
    args = build_parser().parse_args(["serve", model, *flags])
    return engine_config(argparse.Namespace(**{**vars(args), "model": model}))


@pytest.mark.parametrize(("settings", "flags"), CASES, ids=["defaults", "cache-and-precision", "caps-and-adapters"])
def test_llm_builds_the_config_pagode_serve_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    settings: dict[str, object], flags: list[str]) -> None:
    model = str(tmp_path / "model.gguf")
    assert offline(monkeypatch, model, settings) == served(model, flags)


def test_the_offline_default_is_the_servers_fast_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = offline(monkeypatch, str(tmp_path / "model.gguf"), {})
    assert (config.quantization, config.kv_cache_dtype) == ("auto", "auto")
    assert EngineConfig().quantization == "auto"
