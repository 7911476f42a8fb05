"""What a checkpoint folder says about pooling: its architecture, and sentence-transformers'
modules (pooling mode, normalization, prompts, Matryoshka dimensions), read once at load.

sentence-transformers keeps these beside the transformer's own config: `modules.json` lists
the stages, `1_Pooling/config.json` picks the pooling, a `Normalize` module L2-normalizes, and
`config_sentence_transformers.json` holds the prompts. Reading the same files gives the same
vectors as `SentenceTransformer.encode`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENCODER_TYPES = ("bert", "xlm-roberta", "nomic_bert", "modernbert")
# The pooling modes of sentence-transformers' Pooling module that pagode computes.
POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                "pooling_mode_lasttoken": "last"}
UNSUPPORTED_POOLING_KEYS = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                            "pooling_mode_weightedmean_tokens")
# Qwen3-Reranker's system prompt and turn markup, as the model card and vLLM format a pair.
QWEN3_RERANK_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
QWEN3_RERANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@dataclass(frozen=True)
class PoolingSpec:
    """How a loaded checkpoint turns token states into what the API returns."""

    task: str  # embed or score
    model_type: str  # bert, xlm-roberta, nomic_bert, qwen3, ...
    pooling: str = "cls"  # cls, mean or last
    normalize: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    max_seq_length: int | None = None  # sentence-transformers' truncation length
    # score models: the classifier's output activation, and for yes/no rerankers the two tokens
    sigmoid: bool = True
    yes_no_tokens: tuple[str, str] | None = None  # (yes, no): a causal LM scored by their logits
    matryoshka: bool = True  # whether `dimensions` may shorten the vector

    @property
    def is_encoder(self) -> bool:
        return self.model_type in ENCODER_TYPES


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def architectures(folder: Path) -> list[str]:
    config = read_json(folder / "config.json") or {}
    return list(config.get("architectures") or [])


def detect_task(folder: Path) -> str:
    """embed, score or generate, from the checkpoint alone: sentence-transformers' files or an
    encoder architecture mean embeddings; a sequence classifier (or a reranker marked as vLLM
    marks Qwen3-Reranker) means scores; anything else generates."""
    config = read_json(folder / "config.json") or {}
    archs = architectures(folder)
    if any(a.endswith("ForSequenceClassification") for a in archs) or _is_yes_no_reranker(config):
        return "score"
    if (folder / "modules.json").exists() or config.get("model_type") in ENCODER_TYPES:
        return "embed"
    return "generate"


def _is_yes_no_reranker(config: dict[str, Any]) -> bool:
    return bool(config.get("is_original_qwen3_reranker") or config.get("classifier_from_token"))


def read_spec(folder: Path, task: str) -> PoolingSpec:
    """The pooling spec of the folder for `task` (embed or score)."""
    config = read_json(folder / "config.json") or {}
    model_type = str(config.get("model_type", ""))
    st_config = read_json(folder / "config_sentence_transformers.json") or {}
    prompts = {str(k): str(v) for k, v in (st_config.get("prompts") or {}).items()}
    bert_config = read_json(folder / "sentence_bert_config.json") or {}
    max_seq = bert_config.get("max_seq_length")
    if task == "score":
        return _score_spec(config, model_type, prompts, max_seq)
    pooling, normalize = _read_modules(folder, model_type)
    return PoolingSpec(task="embed", model_type=model_type, pooling=pooling, normalize=normalize,
                       prompts=prompts, default_prompt_name=st_config.get("default_prompt_name"),
                       max_seq_length=int(max_seq) if max_seq else None)


def _score_spec(config: dict[str, Any], model_type: str, prompts: dict[str, str],
                max_seq: int | None) -> PoolingSpec:
    if _is_yes_no_reranker(config) or model_type not in ENCODER_TYPES:
        tokens = config.get("classifier_from_token") or ["no", "yes"]
        return PoolingSpec(task="score", model_type=model_type, pooling="last", prompts=prompts,
                           yes_no_tokens=(str(tokens[1]), str(tokens[0])), matryoshka=False)
    activation = str((config.get("sentence_transformers") or {}).get("activation_fn", ""))
    num_labels = len(config.get("id2label") or {"0": "LABEL_0"})
    sigmoid = "Sigmoid" in activation or (not activation and num_labels == 1)
    return PoolingSpec(task="score", model_type=model_type, pooling="cls", sigmoid=sigmoid,
                       max_seq_length=int(max_seq) if max_seq else None, matryoshka=False)


def _read_modules(folder: Path, model_type: str) -> tuple[str, bool]:
    """(pooling mode, normalize) from modules.json and the Pooling module's config; without
    them, an encoder pools its CLS token and a decoder its last token, as vLLM defaults."""
    default = "cls" if model_type in ENCODER_TYPES else "last"
    modules = read_json(folder / "modules.json")
    if not modules:
        return default, model_type not in ENCODER_TYPES
    normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    pooling_dir = next((m.get("path", "") for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
    if pooling_dir is None:
        return default, normalize
    pooling_config = read_json(folder / pooling_dir / "config.json") or {}
    chosen = [mode for key, mode in POOLING_KEYS.items() if pooling_config.get(key)]
    refused = [key for key in UNSUPPORTED_POOLING_KEYS if pooling_config.get(key)]
    if refused or len(chosen) != 1:
        raise ValueError(f"{folder / pooling_dir / 'config.json'}: pagode pools by exactly one of "
                         f"CLS, mean or last token; this one asks for {refused + chosen or 'none'}")
    return chosen[0], normalize
