"""Every served family: greedy output equals transformers' on the same weights, loaded from an
HF folder and from a GGUF written with llama.cpp's names (tests/tiny_models.py)."""

from __future__ import annotations

import pytest
from tiny_models import TinySpec, TinyZoo, assert_engine_matches, tiny_spec

SPECS = [
    tiny_spec("llama", "LlamaConfig", "LlamaForCausalLM", "llama"),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_folder_matches_transformers(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    assert_engine_matches(tiny_zoo.folder(spec), tiny_zoo.reference(spec))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.gguf_arch], ids=lambda s: s.name)
def test_gguf_matches_transformers(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    path, reference = tiny_zoo.gguf(spec, "Q8_0")
    assert_engine_matches(path, reference)
