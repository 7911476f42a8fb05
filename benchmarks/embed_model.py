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
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    return folder


def texts(count: int, min_tokens: int, max_tokens: int, seed: int = 0) -> list[str]:
    """`count` texts of min..max tokens each ([CLS] and [SEP] included), uniformly spread."""
    rng = np.random.default_rng(seed)
    vocab = words()
    lengths = rng.integers(min_tokens, max_tokens + 1, count)
    return [" ".join(vocab[j] for j in rng.integers(0, len(vocab), n - 2)) for n in lengths]
