"""A random-weight BERT embedder at all-MiniLM-L6-v2's shape (6 layers, 384 wide, 12 heads,
a 30,522-token WordPiece vocabulary), saved in sentence-transformers' folder layout with mean
pooling and normalization: what `make bench-embed` serves when no --model is given, since no
model hub is reachable here. Its words are whole tokens, so an input's token count is chosen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = 30522
MINILM: dict[str, Any] = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
              max_position_embeddings=512, vocab_size=VOCAB)


def words() -> list[str]:
    """VOCAB - 5 distinct lowercase words, "w" + base-26 letters, none a prefix-split risk."""
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    out = []
    for i in range(VOCAB - len(SPECIALS)):
        letters, n = "", i
        for _ in range(4):
            letters, n = alphabet[n % 26] + letters, n // 26
        out.append("w" + letters)
    return out


def write_sentence_transformers_modules(folder: Path, width: int, pooling_mode: str, max_seq_length: int) -> None:
    """The files that make a transformers folder a sentence-transformers model: Transformer,
    then Pooling in `pooling_mode`, then Normalize."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": width,
                                                                  pooling_mode: True}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))


def build_minilm(folder: Path) -> Path:
    """The folder, built once (kept if it is there already)."""
    if (folder / "modules.json").exists():
        return folder
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast  # type: ignore[attr-defined]

    torch.manual_seed(0)
    BertModel(BertConfig(**MINILM), add_pooling_layer=False).save_pretrained(folder)
    vocab = {tok: i for i, tok in enumerate(SPECIALS + words())}
    BertTokenizerFast(vocab=vocab, model_max_length=512).save_pretrained(folder)
    write_sentence_transformers_modules(folder, 384, "pooling_mode_mean_tokens", 512)
    return folder


def texts(count: int, min_tokens: int, max_tokens: int, seed: int = 0) -> list[str]:
    """`count` texts of min..max tokens each ([CLS] and [SEP] included), uniformly spread."""
    rng = np.random.default_rng(seed)
    vocab = words()
    lengths = rng.integers(min_tokens, max_tokens + 1, count)
    return [" ".join(vocab[j] for j in rng.integers(0, len(vocab), n - 2)) for n in lengths]


# A small Qwen3-Embedding-style decoder: last-token pooling, normalized, the layout
# llama.cpp's converter reads. Its shape is the size of a BERT-small embedder, not of
# Qwen3-Embedding-0.6B, so that the file and a 1,000-input run stay small on two cores.
QWEN3_EMBED: dict[str, Any] = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                   num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                                   max_position_embeddings=2048, rope_theta=1000000.0, tie_word_embeddings=True)


def build_qwen3_embedding(folder: Path) -> Path:
    """A random Qwen3-Embedding-style folder with SmolLM2's real tokenizer (the one the default
    model's GGUF carries): llama.cpp's converter refuses tokenizers whose pre-tokenizer it
    does not know, and knows SmolLM2's."""
    if (folder / "modules.json").exists():
        return folder
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model  # type: ignore[attr-defined]

    from engine.model.loader import default_model_path

    torch.manual_seed(0)
    tokenizer_file = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_file.parent), gguf_file=tokenizer_file.name)
    Qwen3Model(Qwen3Config(vocab_size=len(tokenizer), **QWEN3_EMBED)).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["Qwen3ForCausalLM"]  # as Qwen3-Embedding's folder declares it
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer.save_pretrained(folder)
    write_sentence_transformers_modules(folder, QWEN3_EMBED["hidden_size"], "pooling_mode_lasttoken", 2048)
    return folder


def convert_to_gguf(folder: Path, outtype: str = "f32") -> Path:
    """The folder as llama.cpp's own convert_hf_to_gguf.py writes it (pooling_type 3: last)."""
    import subprocess
    import sys

    from benchmarks.llama_server import converter

    out = folder.parent / f"{folder.name}.{outtype}.gguf"
    if not out.exists():
        subprocess.run([sys.executable, str(converter()), str(folder), "--outtype", outtype, "--outfile", str(out)],
                       check=True, capture_output=True, text=True)
    return out
