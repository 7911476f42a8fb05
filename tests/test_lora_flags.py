"""vLLM's LoRA flags on `pagode serve`: --lora-modules NAME=PATH (or vLLM's JSON), repeatable,
implies --enable-lora; --max-loras and --max-lora-rank reach the engine; a malformed module is
a usage error that names the form it wants."""

from __future__ import annotations

import argparse

import pytest

from engine.arg_utils import add_engine_flags, engine_config


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser()
    add_engine_flags(made)
    return made


def test_flags_reach_the_engine_config() -> None:
    args = parser().parse_args(["--device", "cpu", "--lora-modules", "sql=/adapters/sql", "--lora-modules",
                                '{"name": "chat", "path": "/adapters/chat", "base_model_name": "x"}',
                                "--max-loras", "4", "--max-lora-rank", "64"])
    config = engine_config(args)
    assert config.enable_lora and config.max_loras == 4 and config.max_lora_rank == 64
    assert config.lora_modules == {"sql": "/adapters/sql", "chat": "/adapters/chat"}


def test_defaults_are_vllms_and_off() -> None:
    config = engine_config(parser().parse_args(["--device", "cpu"]))
    assert (config.enable_lora, config.max_loras, config.max_lora_rank, config.lora_modules) == (False, 1, 16, None)
    assert engine_config(parser().parse_args(["--device", "cpu", "--enable-lora"])).enable_lora


@pytest.mark.parametrize("value, message", [("sql", "NAME=PATH"), ("=/x", "NAME=PATH"),
                                            ('{"name": "sql"}', "name and path")])
def test_malformed_modules_are_usage_errors(value: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--lora-modules", value])
    assert message in capsys.readouterr().err


def test_a_bad_rank_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="max_lora_rank must be positive"):
        engine_config(parser().parse_args(["--device", "cpu", "--max-lora-rank", "0"]))
