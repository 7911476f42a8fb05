"""An encoder checkpoint's tensors under pagode's module names: transformers' names with the
model prefix stripped, nomic-bert's layers and the cross-encoders' heads renamed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from engine.model.weights import iter_safetensors
from engine.pooling.checkpoint import read_json
from engine.pooling.encoder import Encoder, encoder_config
from engine.pooling.modernbert import ModernBert, modernbert_config

Named = tuple[str, torch.Tensor]
MODEL_PREFIXES = ("bert.", "roberta.", "nomic_bert.", "model.")
# Buffers some checkpoints carry; the encoder computes them.
SKIPPED_SUFFIXES = ("position_ids", "token_type_ids", "inv_freq")
# nomic-bert as its checkpoints store it (transformers renames the same way when it loads one).
NOMIC_NAMES = {"emb_ln.": "embeddings.LayerNorm.", "encoder.layers.": "encoder.layer.",
               "attn.out_proj.": "self_attn.o_proj.", "mlp.fc11.": "mlp.up_proj.", "mlp.fc12.": "mlp.gate_proj.",
               "mlp.fc2.": "mlp.down_proj.", "norm1.": "post_attention_layernorm.", "norm2.": "post_mlp_layernorm."}
HEAD_NAMES = {"pooler.dense.": "head.dense.", "classifier.dense.": "head.dense.",
              "classifier.out_proj.": "head.out_proj.", "classifier.": "head.out_proj."}


def load_encoder(folder: Path, num_labels: int = 0) -> Encoder | ModernBert:
    """The encoder of `folder` in fp32, in eval mode; with num_labels, its classifier too."""
    hf = read_json(folder / "config.json")
    model: Encoder | ModernBert
    if hf["model_type"] == "modernbert":
        model = ModernBert(modernbert_config(hf, num_labels))
        found = dict(modernbert_names(iter_safetensors(folder), keep_head=num_labels > 0))
    else:
        model = Encoder(encoder_config(hf, num_labels))
        found = dict(renamed(iter_safetensors(folder), keep_head=num_labels > 0))
    wanted = model.state_dict()
    missing = sorted(set(wanted) - set(found))
    if missing and all(name.startswith(("head.", "classifier.")) for name in missing):
        raise ValueError(f"{folder}: the checkpoint has no classifier head to score with; serve it with --task embed")
    if missing:
        raise ValueError(f"{folder}: the checkpoint lacks {missing[:4]} (and {max(0, len(missing) - 4)} more)")
    model.load_state_dict({name: found[name].float() for name in wanted}, strict=True)
    return model.eval()


def renamed(tensors: Iterable[Named], keep_head: bool) -> Iterator[Named]:
    for name, tensor in tensors:
        if name.endswith(SKIPPED_SUFFIXES):
            continue
        new = pagode_name(name)
        if new.startswith("head.") and not keep_head:
            continue
        if new.endswith("attn.Wqkv.weight"):  # nomic-bert's fused projection, q, k, v stacked
            for part, chunk in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                yield new.replace("attn.Wqkv", f"self_attn.{part}_proj"), chunk
            continue
        yield new, tensor


def pagode_name(name: str) -> str:
    for prefix in MODEL_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.startswith("layers."):  # nomic-bert as transformers names it
        return "encoder.layer." + name[len("layers."):]
    if name.startswith(("emb_ln.", "encoder.layers.")):
        for old, new in NOMIC_NAMES.items():
            name = name.replace(old, new)
        return name
    for old, new in HEAD_NAMES.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def modernbert_names(tensors: Iterable[Named], keep_head: bool) -> Iterator[Named]:
    """ModernBERT's names are the modules' own: only the model prefix goes, and without a
    classifier the head and the masked-LM decoder are dropped."""
    for name, tensor in tensors:
        name = name.removeprefix("model.")
        if name.startswith(("head.", "classifier.")) and not keep_head or name.startswith("decoder."):
            continue
        yield name, tensor
