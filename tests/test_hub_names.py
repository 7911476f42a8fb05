"""llama.cpp's `-hf` pick of a GGUF from a repo's file list, and what a folder repo needs."""

from __future__ import annotations

import pytest

from engine.model.hub_names import HubName, MissingQuant, folder_files, parse_hub_name, pick_gguf

REPO = ["README.md", "model-Q8_0.gguf", "model-q4_k_m.gguf", "model-Q4_K_S.gguf", "mmproj-model-Q4_K_M.gguf",
        "model-Q4_K_M.imatrix.gguf", "big/model-Q6_K-00001-of-00002.gguf", "big/model-Q6_K-00002-of-00002.gguf"]


def test_hub_names_and_local_paths() -> None:
    assert parse_hub_name("Qwen/Qwen3-1.7B") == HubName("Qwen/Qwen3-1.7B", None)
    assert parse_hub_name("unsloth/Qwen3-1.7B-GGUF:Q4_K_M") == HubName("unsloth/Qwen3-1.7B-GGUF", "Q4_K_M")
    for local in ("./models/x", "/abs/path", "~/m/x", "model.gguf", "a/b/c"):
        assert parse_hub_name(local) is None


def test_the_tag_is_matched_case_insensitively_and_projectors_are_skipped() -> None:
    assert pick_gguf(REPO, "Q4_K_M") == ["model-q4_k_m.gguf"]
    assert pick_gguf(REPO, "q8_0") == ["model-Q8_0.gguf"]


def test_no_tag_prefers_q4_k_m_then_q8_0_then_the_first() -> None:
    assert pick_gguf(REPO, None) == ["model-q4_k_m.gguf"]
    assert pick_gguf(["a-Q8_0.gguf", "a-Q2_K.gguf"], None) == ["a-Q8_0.gguf"]
    assert pick_gguf(["a-Q2_K.gguf", "a-Q3_K.gguf"], None) == ["a-Q2_K.gguf"]


def test_a_split_file_brings_every_part() -> None:
    assert pick_gguf(REPO, "Q6_K") == ["big/model-Q6_K-00001-of-00002.gguf", "big/model-Q6_K-00002-of-00002.gguf"]
    with pytest.raises(MissingQuant, match="lacks its parts big/model-Q6_K-00002-of-00002.gguf"):
        pick_gguf(REPO[:-1], "Q6_K")


def test_a_missing_quant_lists_those_there_are() -> None:
    with pytest.raises(MissingQuant, match=r"'IQ2_XS'; the repo has: Q8_0, Q4_K_M, Q4_K_S, Q6_K$"):
        pick_gguf(REPO, "IQ2_XS")


def test_a_folder_takes_config_weights_and_tokenizer_only() -> None:
    files = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
             "model.safetensors.index.json", "tokenizer.json", "pytorch_model.bin", "consolidated.safetensors",
             "original/params.json", "onnx/model.onnx", "README.md", "chat_template.jinja"]
    assert folder_files(files) == ["chat_template.jinja", "config.json", "model-00001-of-00002.safetensors",
                                   "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                                   "tokenizer.json"]
