"""engine.envs: the one typed place for PAGODE_* switches, read when used."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from engine import envs

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "server", "loadgen", "cuda_kernels", "cpu_kernels", "planner", "benchmarks")


def test_values_are_read_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGODE_QUANT_CROSSOVER", raising=False)
    assert envs.QUANT_CROSSOVER.get() is None
    monkeypatch.setenv("PAGODE_QUANT_CROSSOVER", "24")
    assert envs.QUANT_CROSSOVER.get() == 24
    monkeypatch.setenv("PAGODE_CPU_KERNEL", "0")
    assert envs.CPU_KERNEL.get() is False
    monkeypatch.setenv("PAGODE_CPU_KERNEL", "")
    assert envs.CPU_KERNEL.get() is True  # empty means unset
    monkeypatch.setenv("PAGODE_CACHE_DIR", "/tmp/somewhere")
    assert envs.CACHE_DIR.get() == Path("/tmp/somewhere")


def test_a_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGODE_DECODE_STEP", "maybe")
    with pytest.raises(ValueError, match="PAGODE_DECODE_STEP='maybe'"):
        envs.DECODE_STEP.get()


def test_every_variable_is_documented_and_the_key_is_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGODE_API_KEY", "secret-key")
    text = envs.describe()
    assert "secret-key" not in text
    for var in envs.ALL:
        assert var.name.startswith("PAGODE_") and len(var.doc) > 20
        assert var.name in text


def test_no_other_module_reads_pagode_variables() -> None:
    """Only engine/envs.py names a PAGODE_* variable in code that reads the environment."""
    reading = re.compile(r"(environ|getenv)[^\n]*PAGODE_")
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")) if (ROOT / package).exists() else []:
            if path.name == "envs.py" and path.parent.name == "engine":
                continue
            if reading.search(path.read_text()):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_the_tests_run_with_a_cache_of_their_own() -> None:
    """A developer's earlier `pagode plan --calibrate` must not size the test servers."""
    cache = envs.CACHE_DIR.get()
    assert cache != Path.home() / ".cache" / "pagode"
    assert not (cache / "plan").exists()
    assert os.environ["PAGODE_CACHE_DIR"] == str(cache)  # what every test server inherits
