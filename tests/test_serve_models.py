"""Which models `pagode serve` serves, from its flags: --model more than once with
--served-model-name in the same order, --models-dir, and the load limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.cli import build_parser
from server.runtime.model_registry import LoadLimits
from server.serve_models import ModelEntry, load_limits, model_entries


def entries(*argv: str) -> list[ModelEntry]:
    return model_entries(build_parser().parse_args(["serve", *argv]))


def test_one_model_keeps_its_single_model_defaults() -> None:
    assert entries() == [ModelEntry(None, None)]  # the embedded default, named by the engine
    assert entries("/m/a") == [ModelEntry(None, "/m/a")]
    assert entries("--model", "/m/a", "--served-model-name", "a") == [ModelEntry("a", "/m/a")]


def test_names_follow_the_models_in_order() -> None:
    assert entries("/m/a", "--model", "/m/b", "--served-model-name", "a", "--served-model-name", "b") == [
        ModelEntry("a", "/m/a"), ModelEntry("b", "/m/b")]
    with pytest.raises(ValueError, match="3 --served-model-name for 2 --model"):
        entries("--model", "/m/a", "--model", "/m/b", *["--served-model-name", "x"] * 3)
    with pytest.raises(ValueError, match="two models are served as 'x'"):
        entries("--model", "/m/a", "--model", "/m/b", *["--served-model-name", "x"] * 2)


def test_models_dir_lists_folders_and_gguf_files(tmp_path: Path) -> None:
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text("{}")
    (tmp_path / "notes").mkdir()  # no config.json: not a model
    for name in ("qwen-Q8_0.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf", "mmproj-x.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    assert entries("--models-dir", str(tmp_path)) == [
        ModelEntry("big", str(tmp_path / "big-00001-of-00002.gguf")), ModelEntry("llama", str(tmp_path / "llama")),
        ModelEntry("qwen-Q8_0", str(tmp_path / "qwen-Q8_0.gguf"))]
    with pytest.raises(ValueError, match="no model folder"):
        entries("--models-dir", str(tmp_path / "notes"))


def test_load_limits() -> None:
    parse = build_parser().parse_args
    assert load_limits(parse(["serve", "--max-loaded-models", "2", "--models-memory", "1GiB"])) == LoadLimits(2, 2**30)
    with pytest.raises(ValueError, match="must be positive"):
        load_limits(parse(["serve", "--max-loaded-models", "0"]))
