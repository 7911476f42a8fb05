"""--speculative-config follows vLLM's JSON shape and validation rules."""

from __future__ import annotations

import pytest

from engine.speculative_config import SpeculativeConfig, parse_speculative_config


def test_full_config_is_read() -> None:
    cfg = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, '
                                   '"prompt_lookup_min": 2, "prompt_lookup_max": 3}')
    assert cfg == SpeculativeConfig("ngram", 4, 2, 3)


def test_lookup_defaults_and_copying() -> None:
    assert parse_speculative_config({"method": "[ngram]", "num_speculative_tokens": 3}) == \
        SpeculativeConfig("ngram", 3, 5, 5)
    assert parse_speculative_config({"num_speculative_tokens": 3, "prompt_lookup_max": 2}) == \
        SpeculativeConfig("ngram", 3, 2, 2)
    assert parse_speculative_config({"num_speculative_tokens": 3, "prompt_lookup_min": 4}) == \
        SpeculativeConfig("ngram", 3, 4, 4)


@pytest.mark.parametrize("text", [None, ""])
def test_absent_means_off(text: str | None) -> None:
    assert parse_speculative_config(text) is None


@pytest.mark.parametrize("text, message", [
    ('{"method": "eagle", "num_speculative_tokens": 2}', "method"),
    ('{"method": "ngram"}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": true}', "num_speculative_tokens"),
    ('{"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}', "prompt_lookup_min"),
    ('{"num_speculative_tokens": 2, "prompt_lookup_min": 0}', "prompt_lookup_min"),
    ('{"num_speculative_tokens": 2, "lookahead": 3}', "unknown keys"),
    ('[1, 2]', "JSON object"),
])
def test_bad_configs_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_speculative_config(text)


def test_flag_sets_the_engine_config_and_refuses_bad_json(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from engine.arg_utils import add_engine_flags, engine_config
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    args = parser.parse_args(["--device", "cpu", "--speculative-config",
                              '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'])
    assert engine_config(args).speculative_config == SpeculativeConfig("ngram", 3, 4, 4)
    assert engine_config(parser.parse_args(["--device", "cpu"])).speculative_config is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": -1}'])
    assert "num_speculative_tokens" in capsys.readouterr().err
